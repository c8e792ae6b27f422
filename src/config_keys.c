/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Configuration, its keys: one table (cfg_keys[]) with each key's type,
 * default, range and help, which drives the parser, `sluice -t` and the
 * man page check; and the typed setter it drives (cfg_set_value): a
 * scalar parsed as its row's type, range-checked, reported at its node.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "sl_config.h"
#include "config_int.h"


/* ---- the key table ---------------------------------------------------- */

/*
 * The key table. min/max are in the key's unit (bytes, ms, or plain
 * integers). `off` says where the value goes for scalar top-level keys;
 * per-upstream and per-tenant keys are handled by name.
 */
const struct key_row cfg_keys[] = {
	{ { "listen", SL_KEY_ADDR, NULL, "host:port or [v6]:port", 0,
	    "Address the gateway accepts client connections on." },
	    0, 0, 1, OFF(listen) },
	{ { "workers", SL_KEY_WORKERS, "auto", "1-64 or auto", 1,
	    "Number of worker processes; auto means one per CPU." },
	    1, SL_MAX_WORKERS, 0, OFF(workers) },
	{ { "admin_listen", SL_KEY_ADDR, NULL, "host:port or [v6]:port", 0,
	    "Address of the admin listener (the console at /, /status.json, "
	    "/metrics, /healthz); unset: none." },
	    0, 0, 0, OFF(admin_listen) },
	{ { "stream_buffer", SL_KEY_SIZE, "64KiB", "16KiB-1GiB", 1,
	    "Per-stream bound on response bytes waiting for a slow client; "
	    "when full, the upstream is no longer read." },
	    16 * KIB, GIB, 0, OFF(stream_buffer) },
	{ { "drain_timeout", SL_KEY_DURATION, "30s", "0-24h", 1,
	    "On SIGTERM, how long in-flight streams may run before they are cut." },
	    0, 24 * HOUR, 0, OFF(drain_timeout_ms) },
	{ { "access_log", SL_KEY_LOGDEST, "off", "path, stderr or off", 1,
	    "Where one line per request is written." },
	    0, 0, 0, OFF(access_log) },
	{ { "log_level", SL_KEY_LOGLEVEL, "info", "error, warn, info, debug", 1,
	    "Least severe level of the error log (stderr)." },
	    0, 0, 0, OFF(log_level) },
	{ { "timeouts", SL_KEY_MAP, NULL, NULL, 1, "Timeouts, all durations." },
	    0, 0, 0, NOOFF },
	{ { "timeouts.upstream_connect", SL_KEY_DURATION, "5s", "1ms-10m", 1,
	    "Connecting to the upstream; past it the client gets 502." },
	    1, 10 * MIN, 0, OFF(timeouts.upstream_connect_ms) },
	{ { "timeouts.upstream_first_byte", SL_KEY_DURATION, "120s", "1ms-24h", 1,
	    "From sending the request to the upstream's response head; past it 504." },
	    1, 24 * HOUR, 0, OFF(timeouts.upstream_first_byte_ms) },
	{ { "timeouts.upstream_idle", SL_KEY_DURATION, "120s", "1ms-24h", 1,
	    "Longest silence of the upstream mid-stream; past it the stream is cut." },
	    1, 24 * HOUR, 0, OFF(timeouts.upstream_idle_ms) },
	{ { "timeouts.client_header", SL_KEY_DURATION, "10s", "1ms-1h", 1,
	    "Time to receive a complete request head; past it 408 and close." },
	    1, HOUR, 0, OFF(timeouts.client_header_ms) },
	{ { "timeouts.client_body", SL_KEY_DURATION, "60s", "1ms-24h", 1,
	    "Time to receive a whole request body once admitted; past it 408, "
	    "close, and the slot is freed." },
	    1, 24 * HOUR, 0, OFF(timeouts.client_body_ms) },
	{ { "timeouts.client_stall", SL_KEY_DURATION, "30s", "1ms-24h", 1,
	    "How long a client may accept no bytes while its stream buffer is "
	    "full; past it the stream is cut and the slot freed." },
	    1, 24 * HOUR, 0, OFF(timeouts.client_stall_ms) },
	{ { "timeouts.keepalive", SL_KEY_DURATION, "60s", "0-1h", 1,
	    "Idle time allowed between requests on a connection; 0 closes after "
	    "each response." },
	    0, HOUR, 0, OFF(timeouts.keepalive_ms) },
	{ { "limits", SL_KEY_MAP, NULL, NULL, 1, "Request and connection limits." },
	    0, 0, 0, NOOFF },
	{ { "limits.max_header_bytes", SL_KEY_SIZE, "32KiB", "1KiB-1MiB", 1,
	    "Largest request head (request line and headers); past it 431." },
	    KIB, MIB, 0, OFF(limits.max_header_bytes) },
	{ { "limits.max_body_bytes", SL_KEY_SIZE, "16MiB", "0-1GiB", 1,
	    "Largest request body; past it 413." },
	    0, GIB, 0, OFF(limits.max_body_bytes) },
	{ { "limits.max_connections", SL_KEY_INT, "20000", "1-1000000", 1,
	    "Client connections per worker; past it new connections get 503." },
	    1, 1000000, 0, OFF(limits.max_connections) },
	{ { "limits.upstream_rcvbuf", SL_KEY_SIZE, "256KiB", "0-64MiB", 1,
	    "SO_RCVBUF of upstream sockets, so a paused stream pushes back on "
	    "the upstream within stream_buffer plus about this; 0: the kernel "
	    "autotunes it." },
	    0, 64 * MIB, 0, OFF(limits.upstream_rcvbuf) },
	{ { "limits.client_sndbuf", SL_KEY_SIZE, "0", "0-64MiB", 1,
	    "SO_SNDBUF of client sockets, bounding how far a slow client may "
	    "fall behind in kernel buffers before its upstream is paused; 0: "
	    "the kernel autotunes it." },
	    0, 64 * MIB, 0, OFF(limits.client_sndbuf) },
	{ { "limits.max_tenants", SL_KEY_INT, "100000", "1-1000000", 0,
	    "Tenants the gateway has room for, fixed at start: a reload may "
	    "name up to this many, old and new tenants alike, with no restart. "
	    "Room costs no memory until a tenant uses it." },
	    1, SL_MAX_TENANTS, 0, OFF(limits.max_tenants) },
	{ { "limits.max_models", SL_KEY_INT, "10000", "1-100000", 0,
	    "Models (names under models:) the gateway has room for, fixed at "
	    "start: a reload may name up to this many with no restart. Room "
	    "costs no memory until a model uses it." },
	    1, SL_MAX_MODELS, 0, OFF(limits.max_models) },
	{ { "limits.max_upstreams", SL_KEY_INT, "1000", "1-10000", 0,
	    "Upstreams (pools) the gateway has room for, fixed at start, with "
	    "their replicas: at most 4 per upstream of this limit or 4096 in "
	    "all, whichever is more; at most 64 upstreams with a queue. Room "
	    "costs no memory until used." },
	    1, SL_MAX_UPSTREAMS_LIMIT, 0, OFF(limits.max_upstreams) },
	{ { "limits.h2_max_streams", SL_KEY_INT, "100", "1-1000", 1,
	    "HTTP/2 streams one client connection may have open at once "
	    "(SETTINGS_MAX_CONCURRENT_STREAMS)." },
	    1, 1000, 0, OFF(limits.h2_max_streams) },
	{ { "tls", SL_KEY_MAP, NULL, NULL, 1,
	    "TLS on the listener: present, it speaks TLS only; absent, plain "
	    "HTTP. A reload takes a new certificate for new connections." },
	    0, 0, 0, NOOFF },
	{ { "tls.cert", SL_KEY_STRING, NULL, "path of a PEM file", 1,
	    "Certificate chain, leaf first; checked by sluice -t and at every "
	    "load (readable, valid now; a warning within 14 days of expiry)." },
	    0, 0, 0, OFF(tls.cert) },
	{ { "tls.key", SL_KEY_STRING, NULL, "path of a PEM file", 1,
	    "Private key of the leaf; must match it." },
	    0, 0, 0, OFF(tls.key) },
	{ { "tls.min_version", SL_KEY_STRING, "TLSv1.2", "TLSv1.2 or TLSv1.3", 1,
	    "Oldest protocol version a client may use." },
	    0, 0, 0, OFF(tls.min_version) },
	{ { "tls.alpn", SL_KEY_LIST, "[h2, http/1.1]", "h2, http/1.1", 1,
	    "Application protocols offered by ALPN, in order of preference." },
	    0, 0, 0, NOOFF },
	{ { "cluster", SL_KEY_MAP, NULL, NULL, 0,
	    "One per-tenant limit across several sluice nodes, through Redis "
	    "leases; absent: this node alone." },
	    0, 0, 0, NOOFF },
	{ { "cluster.redis", SL_KEY_STRING, NULL,
	    "IP:port, [v6]:port or unix:/path", 0,
	    "The Redis server holding the leases (an address: host names are "
	    "not resolved); exactly one of redis and sentinels." },
	    0, 0, 0, OFF(cluster.redis) },
	{ { "cluster.sentinels", SL_KEY_LIST, NULL, "1-16 of IP:port or [v6]:port",
	    0,
	    "Redis Sentinels to ask, in order, for the master holding the "
	    "leases (instead of redis); the node follows a failover." },
	    0, 0, 0, NOOFF },
	{ { "cluster.master_name", SL_KEY_STRING, NULL,
	    "1-64 of A-Z a-z 0-9 . _ -", 0,
	    "The name the sentinels monitor the master under; required with "
	    "sentinels." },
	    0, 0, 0, OFF(cluster.master_name) },
	{ { "cluster.sentinel_password", SL_KEY_STRING, "\"\"", NULL, 0,
	    "Sent with AUTH to the sentinels (their requirepass); empty: no "
	    "AUTH. password is the master's." },
	    0, 0, 0, OFF(cluster.sentinel_password) },
	{ { "cluster.password", SL_KEY_STRING, "\"\"", NULL, 0,
	    "Sent with AUTH on every connection; empty: no AUTH." },
	    0, 0, 0, OFF(cluster.password) },
	{ { "cluster.node", SL_KEY_STRING, "the host name",
	    "1-64 of A-Z a-z 0-9 . _ -", 0,
	    "This node's name in Redis; unique per node." },
	    0, 0, 0, OFF(cluster.node) },
	{ { "cluster.lease_ttl", SL_KEY_DURATION, "10s", "1s-1h", 1,
	    "A lease not renewed for this long expires: a dead node's slots "
	    "come back within it." },
	    SEC, HOUR, 0, OFF(cluster.lease_ttl_ms) },
	{ { "cluster.heartbeat", SL_KEY_DURATION, "2s", "100ms-20m", 1,
	    "How often the master renews this node's leases and registration; "
	    "at most lease_ttl / 3." },
	    100, 20 * MIN, 0, OFF(cluster.heartbeat_ms) },
	{ { "cluster.timeout", SL_KEY_DURATION, "100ms", "1ms-10s", 1,
	    "Longest an admission waits for Redis before on_redis_down decides." },
	    1, 10 * SEC, 0, OFF(cluster.timeout_ms) },
	{ { "cluster.on_redis_down", SL_KEY_REDIS_DOWN, "local_share",
	    "local_share, closed or local_full", 1,
	    "Admission while Redis cannot be trusted: a share of max_streams "
	    "by live nodes, 503, or max_streams on this node." },
	    0, 0, 0, OFF(cluster.on_redis_down) },
	{ { "usage", SL_KEY_MAP, NULL, NULL, 1,
	    "Token accounting read from responses." },
	    0, 0, 0, NOOFF },
	{ { "usage.enabled", SL_KEY_BOOL, "true", "true or false", 1,
	    "Read the token usage of responses; false: no body is parsed and "
	    "no token counted (tokens_per_minute must then be 0)." },
	    0, 0, 0, OFF(usage.enabled) },
	{ { "usage.inject", SL_KEY_BOOL, "true", "true or false", 1,
	    "Ask streamed requests' runners for the usage chunk (and hide it "
	    "from clients that did not ask), so their tokens are exact." },
	    0, 0, 0, OFF(usage.inject) },
	{ { "models", SL_KEY_MAP, NULL, "1 to limits.max_models models", 1,
	    "The models clients name in a request body's \"model\", by name; "
	    "absent: every request goes to its tenant's upstream." },
	    0, 0, 0, NOOFF },
	{ { "models.*.aliases", SL_KEY_LIST, "[]",
	    "names no other model uses", 1,
	    "Other names clients may send for the model." },
	    0, 0, 0, NOOFF },
	{ { "models.*.fallback", SL_KEY_LIST, "[]", "model names or aliases", 1,
	    "Models tried in order when none of this model's targets can take "
	    "a request, before any response byte." },
	    0, 0, 0, NOOFF },
	{ { "models.*.targets", SL_KEY_LIST_OF_MAPS, NULL, "1-64 entries", 1,
	    "Where the model is served; their weights split its requests." },
	    0, 0, 1, NOOFF },
	{ { "models.*.targets[].upstream", SL_KEY_STRING, NULL,
	    "an upstream name", 1,
	    "The upstream (pool) that serves this target." },
	    0, 0, 1, NOOFF },
	{ { "models.*.targets[].model", SL_KEY_STRING, "the model's name", NULL,
	    1, "The \"model\" the upstream is sent for this target." },
	    0, 0, 0, NOOFF },
	{ { "models.*.targets[].weight", SL_KEY_INT, "1", "1-1000", 1,
	    "Share of the model's requests, relative to its other targets." },
	    1, 1000, 0, NOOFF },
	{ { "upstreams", SL_KEY_MAP, NULL, "at least one", 1,
	    "Model runners, by name." },
	    0, 0, 1, NOOFF },
	/* An upstream has url or replicas, exactly one: checked by name. */
	{ { "upstreams.*.url", SL_KEY_STRING, NULL, "http:// or https:// URL", 1,
	    "Base URL of a pool of one replica; the client's path and query "
	    "are appended." },
	    0, 0, 0, NOOFF },
	{ { "upstreams.*.replicas", SL_KEY_LIST_OF_MAPS, NULL, "1-64 entries", 1,
	    "The pool: replicas of one model runner, each a mapping." },
	    0, 0, 0, NOOFF },
	{ { "upstreams.*.replicas[].url", SL_KEY_STRING, NULL,
	    "http:// or https:// URL", 1,
	    "Base URL of the replica; unique within the upstream." },
	    0, 0, 1, NOOFF },
	{ { "upstreams.*.replicas[].weight", SL_KEY_INT, "1", "1-100", 1,
	    "Share of new streams, relative to the other replicas." },
	    1, 100, 0, NOOFF },
	{ { "upstreams.*.replicas[].max_streams", SL_KEY_INT, "0", "0-1000000", 1,
	    "Streams in flight to the replica across all workers; 0: no cap." },
	    0, 1000000, 0, NOOFF },
	{ { "upstreams.*.api_key", SL_KEY_STRING, NULL, NULL, 1,
	    "Sent upstream as Authorization: Bearer; unset: no Authorization." },
	    0, 0, 0, NOOFF },
	{ { "upstreams.*.balance", SL_KEY_STRING, "least_loaded",
	    "least_loaded, round_robin, random or prefix_affinity", 1,
	    "How a replica is chosen for a new stream." },
	    0, 0, 0, NOOFF },
	{ { "upstreams.*.affinity", SL_KEY_MAP, NULL, NULL, 1,
	    "Tuning of balance: prefix_affinity." },
	    0, 0, 0, NOOFF },
	{ { "upstreams.*.affinity.block", SL_KEY_INT, "64", "16-65536", 1,
	    "Prompt bytes per block; a prompt's blocks are hashed in a chain "
	    "and remembered per replica." },
	    16, 65536, 0, NOOFF },
	{ { "upstreams.*.affinity.max_imbalance", SL_KEY_DECIMAL, "1.5",
	    "1.0-100", 1,
	    "Leave the replica holding the prefix when its load is over this "
	    "times the least loaded's and over it by 2 streams or more." },
	    100, 10000, 0, NOOFF },
	{ { "upstreams.*.response_affinity", SL_KEY_MAP, NULL, NULL, 1,
	    "Requests naming a stored response (previous_response_id, "
	    "/v1/responses/{id}) go to the replica that made it; on by "
	    "default." },
	    0, 0, 0, NOOFF },
	{ { "upstreams.*.response_affinity.max", SL_KEY_INT, "100000",
	    "0-1000000", 1,
	    "Response ids remembered for the pool, all workers together; the "
	    "least recently used is forgotten first; 0: off." },
	    0, 1000000, 0, NOOFF },
	{ { "upstreams.*.response_affinity.ttl", SL_KEY_DURATION, "1h",
	    "1s-720h", 1,
	    "An id neither learnt nor used this long is forgotten." },
	    SEC, 720 * HOUR, 0, NOOFF },
	{ { "upstreams.*.load_metrics", SL_KEY_MAP, NULL, NULL, 1,
	    "Scrape each replica's Prometheus page for its queue and KV-cache "
	    "use; absent: in-flight counts only." },
	    0, 0, 0, NOOFF },
	{ { "upstreams.*.load_metrics.path", SL_KEY_STRING, "/metrics",
	    "a path starting with /", 1,
	    "Path scraped with GET on each replica." },
	    0, 0, 0, NOOFF },
	{ { "upstreams.*.load_metrics.interval", SL_KEY_DURATION, "250ms",
	    "50ms-1h", 1,
	    "Time between two scrapes of a replica; a sample older than 4 "
	    "intervals is ignored." },
	    50, HOUR, 0, NOOFF },
	{ { "upstreams.*.retries", SL_KEY_INT, "2", "0-10", 1,
	    "Other replicas tried after a failure, only before the client got "
	    "any byte." },
	    0, 10, 0, NOOFF },
	{ { "upstreams.*.retry_on", SL_KEY_LIST, "[connect, busy]",
	    "connect, busy, empty", 1,
	    "Failures that move a request to another replica; [] never retries." },
	    0, 0, 0, NOOFF },
	{ { "upstreams.*.busy_max", SL_KEY_DURATION, "30s", "1s-1h", 1,
	    "Longest a replica's Retry-After (429 or 503) keeps it out; also "
	    "the most a 503 upstream_unavailable's Retry-After says." },
	    SEC, HOUR, 0, NOOFF },
	{ { "upstreams.*.queue", SL_KEY_MAP, NULL, NULL, 1,
	    "When every replica that could take a request is at its "
	    "max_streams, the request waits here for a slot; absent: 503 "
	    "upstream_unavailable at once." },
	    0, 0, 0, NOOFF },
	{ { "upstreams.*.queue.max", SL_KEY_INT, "1000", "1-1000000", 1,
	    "Requests waiting for the pool, all workers together; past it 503 "
	    "queue_full." },
	    1, 1000000, 0, NOOFF },
	{ { "upstreams.*.queue.timeout", SL_KEY_DURATION, "30s", "10ms-1h", 1,
	    "Longest wait; past it 503 queue_timeout." },
	    10, HOUR, 0, NOOFF },
	{ { "upstreams.*.queue.fairness", SL_KEY_STRING, "tokens",
	    "tokens or fifo", 1,
	    "Who goes next within a priority band: tokens, the tenant least "
	    "served by weight; fifo, the oldest request." },
	    0, 0, 0, NOOFF },
	{ { "upstreams.*.inject_priority", SL_KEY_BOOL, "false", "true or false",
	    1,
	    "Add \"priority\": -P (P: the tenant's priority) to JSON request "
	    "bodies, for vLLM --scheduling-policy priority." },
	    0, 0, 0, NOOFF },
	{ { "upstreams.*.health", SL_KEY_MAP, NULL, NULL, 1,
	    "Active health probe of every replica; absent: no probe." },
	    0, 0, 0, NOOFF },
	{ { "upstreams.*.health.path", SL_KEY_STRING, "/health",
	    "a path starting with /", 1,
	    "Path probed with GET on each replica." },
	    0, 0, 0, NOOFF },
	{ { "upstreams.*.health.interval", SL_KEY_DURATION, "2s", "100ms-1h", 1,
	    "Time between two probes of a replica." },
	    100, HOUR, 0, NOOFF },
	{ { "upstreams.*.health.timeout", SL_KEY_DURATION, "1s", "1ms-1h", 1,
	    "Time a probe may take, less than the interval; past it, it failed." },
	    1, HOUR, 0, NOOFF },
	{ { "upstreams.*.health.fall", SL_KEY_INT, "3", "1-100", 1,
	    "Consecutive failed probes that take a replica down." },
	    1, 100, 0, NOOFF },
	{ { "upstreams.*.health.rise", SL_KEY_INT, "2", "1-100", 1,
	    "Consecutive good probes that bring a replica back up." },
	    1, 100, 0, NOOFF },
	{ { "upstreams.*.eject", SL_KEY_MAP, NULL, NULL, 1,
	    "Passive ejection on failures of real traffic; on by default." },
	    0, 0, 0, NOOFF },
	{ { "upstreams.*.eject.failures", SL_KEY_INT, "5", "0-1000", 1,
	    "Consecutive failures that eject a replica; 0: no passive ejection." },
	    0, 1000, 0, NOOFF },
	{ { "upstreams.*.eject.duration", SL_KEY_DURATION, "30s", "1s-5m", 1,
	    "First ejection; doubled on each repeat, capped at 5 minutes." },
	    SEC, 5 * MIN, 0, NOOFF },
	{ { "upstreams.*.eject.max_percent", SL_KEY_INT, "50", "0-100", 1,
	    "Most of the pool, in percent, that may be ejected at once." },
	    0, 100, 0, NOOFF },
	{ { "tenants", SL_KEY_MAP, NULL, "at least one", 1,
	    "Tenants, by name." },
	    0, 0, 1, NOOFF },
	{ { "tenants.*.keys", SL_KEY_LIST, NULL, "non-empty list of strings", 1,
	    "API keys (Authorization: Bearer KEY) that identify the tenant." },
	    0, 0, 1, NOOFF },
	{ { "tenants.*.max_streams", SL_KEY_INT, NULL, "0-1000000", 1,
	    "Concurrent requests in flight across all workers; past it 429; "
	    "0 disables the tenant (403)." },
	    0, 1000000, 1, NOOFF },
	{ { "tenants.*.retry_after", SL_KEY_INT, "1", "1-86400", 1,
	    "Seconds sent in Retry-After with a 429." },
	    1, 86400, 0, NOOFF },
	{ { "tenants.*.tokens_per_minute", SL_KEY_INT, "0", "0-1000000000", 1,
	    "Budget of prompt plus completion tokens over the last 60 s, "
	    "across all workers; at or over it 429; 0: none." },
	    0, 1000000000, 0, NOOFF },
	{ { "tenants.*.weight", SL_KEY_INT, "1", "1-1000", 1,
	    "Share of a saturated pool's queue against the other tenants "
	    "waiting in the same priority band." },
	    1, 1000, 0, NOOFF },
	{ { "tenants.*.priority", SL_KEY_INT, "0", "-100-100", 1,
	    "Queue band: a higher band always goes first; below 0 the tenant "
	    "never waits (503 at once when the pool is full)." },
	    (uint64_t)-100, 100, 0, NOOFF },
	{ { "tenants.*.upstream", SL_KEY_STRING, NULL, "an upstream name", 1,
	    "Upstream serving the tenant's requests that name no model; may be "
	    "omitted when there is one upstream, or a models: section." },
	    0, 0, 0, NOOFF },
	{ { "tenants.*.models", SL_KEY_LIST, "all models", "model names", 1,
	    "The models the tenant may use, by name; absent: all of them." },
	    0, 0, 0, NOOFF },
	{ { NULL, 0, NULL, NULL, 0, NULL }, 0, 0, 0, NOOFF },
};

_Static_assert(sizeof(cfg_keys) / sizeof(cfg_keys[0]) <= CFG_KEYS_MAX,
    "CFG_KEYS_MAX (config_int.h) is below the number of keys");

const struct sl_key_info *
sl_config_keys(void)
{
	static struct sl_key_info infos[sizeof(cfg_keys) / sizeof(cfg_keys[0])];
	size_t i;

	if (infos[0].path == NULL)
		for (i = 0; i < sizeof(cfg_keys) / sizeof(cfg_keys[0]); i++)
			infos[i] = cfg_keys[i].info;
	return infos;
}

const struct key_row *
cfg_find_key(const char *path)
{
	const struct key_row *k;

	for (k = cfg_keys; k->info.path != NULL; k++)
		if (strcmp(k->info.path, path) == 0)
			return k;
	return NULL;
}

/* ---- typed values, by the key table --------------------------------- */

/*
 * Can the workers open this log file? Opened (created if need be) the way
 * the worker does, then closed, so a missing directory is a config error
 * with a position rather than lines dropped later. O_NONBLOCK: a FIFO
 * without a reader fails here instead of hanging the check.
 */
static int
log_dest_opens(struct ctx *c, yaml_node_t *v, const char *path, const char *s)
{
	int fd = open(s, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK,
	    0640);

	if (fd == -1) {
		cfg_err_at(c, &v->start_mark, "%s: cannot open '%s': %s", path, s,
		    strerror(errno));
		return 0;
	}
	close(fd);
	return 1;
}

/*
 * cfg_set_value's step for the numbers (size, duration, integer, decimal):
 * parsed, then held to the row's range.
 */
static void
set_number(struct ctx *c, const struct key_row *row, const char *path,
    yaml_node_t *v, const char *s, void *dst)
{
	uint64_t u;
	int64_t i;

	switch (row->info.type) {
	case SL_KEY_SIZE:
		if (sl_parse_size(s, &u) == -1) {
			cfg_err_at(c, &v->start_mark,
			    "%s: '%s' is not a size (e.g. 64KiB; units B, KiB, MiB, GiB)",
			    path, s);
			return;
		}
		if (u < row->min || u > row->max) {
			cfg_err_at(c, &v->start_mark, "%s: %s is out of range %s",
			    path, s, row->info.range);
			return;
		}
		*(uint64_t *)dst = u;
		return;
	case SL_KEY_DURATION:
		if (sl_parse_duration_ms(s, &u) == -1) {
			cfg_err_at(c, &v->start_mark,
			    "%s: '%s' is not a duration (e.g. 30s; units ms, s, m, h)",
			    path, s);
			return;
		}
		if (u < row->min || u > row->max) {
			cfg_err_at(c, &v->start_mark, "%s: %s is out of range %s",
			    path, s, row->info.range);
			return;
		}
		*(uint64_t *)dst = u;
		return;
	case SL_KEY_INT:
		if (cfg_parse_int(s, &i) == -1) {
			cfg_err_at(c, &v->start_mark, "%s: '%s' is not an integer",
			    path, s);
			return;
		}
		if (i < (int64_t)row->min || i > (int64_t)row->max) {
			cfg_err_at(c, &v->start_mark, "%s: %s is out of range %s",
			    path, s, row->info.range);
			return;
		}
		if (row->off == OFF(limits.max_connections) ||
		    row->off == OFF(limits.h2_max_streams) ||
		    row->off == OFF(limits.max_tenants) ||
		    row->off == OFF(limits.max_models) ||
		    row->off == OFF(limits.max_upstreams))
			*(uint64_t *)dst = (uint64_t)i;
		else
			*(int32_t *)dst = (int32_t)i;
		return;
	case SL_KEY_DECIMAL:
		if (cfg_parse_hundredths(s, &i) == -1) {
			cfg_err_at(c, &v->start_mark, "%s: '%s' is not a decimal number "
			    "(e.g. 1.5, at most 2 decimals)", path, s);
			return;
		}
		if (i < (int64_t)row->min || i > (int64_t)row->max) {
			cfg_err_at(c, &v->start_mark, "%s: %s is out of range %s",
			    path, s, row->info.range);
			return;
		}
		*(int32_t *)dst = (int32_t)i;
		return;
	default:
		return;
	}
}

/*
 * cfg_set_value's step for the words (workers, log level, redis_down,
 * booleans): one of a fixed list, or an integer for workers.
 */
static void
set_word(struct ctx *c, const struct key_row *row, const char *path,
    yaml_node_t *v, const char *s, void *dst)
{
	int64_t i;

	switch (row->info.type) {
	case SL_KEY_WORKERS:
		if (strcmp(s, "auto") == 0) {
			*(int *)dst = SL_WORKERS_AUTO;
			return;
		}
		if (cfg_parse_int(s, &i) == -1 || i < (int64_t)row->min ||
		    i > (int64_t)row->max) {
			cfg_err_at(c, &v->start_mark,
			    "%s: '%s' must be auto or an integer in %s", path, s,
			    row->info.range);
			return;
		}
		*(int *)dst = (int)i;
		return;
	case SL_KEY_LOGLEVEL: {
		static const char *const lv[] = { "error", "warn", "info", "debug" };
		int k;

		for (k = 0; k < 4; k++)
			if (strcmp(s, lv[k]) == 0) {
				*(enum sl_log_level *)dst = (enum sl_log_level)k;
				return;
			}
		cfg_err_at(c, &v->start_mark,
		    "%s: '%s' must be one of error, warn, info, debug", path, s);
		return;
	}
	case SL_KEY_REDIS_DOWN: {
		int k;

		for (k = 0; k <= SL_DOWN_LOCAL_FULL; k++)
			if (strcmp(s, sl_redis_down_name(k)) == 0) {
				*(int32_t *)dst = k;
				return;
			}
		cfg_err_at(c, &v->start_mark,
		    "%s: '%s' must be one of local_share, closed, local_full",
		    path, s);
		return;
	}
	case SL_KEY_BOOL:
		if (strcmp(s, "true") == 0 || strcmp(s, "false") == 0) {
			*(int *)dst = s[0] == 't';
			return;
		}
		cfg_err_at(c, &v->start_mark, "%s: '%s' must be true or false", path, s);
		return;
	default:
		return;
	}
}

/* Parse a scalar value of a typed key into dst; dst's type depends on row. */
void
cfg_set_value(struct ctx *c, const struct key_row *row, const char *path,
    yaml_node_t *v, void *dst)
{
	const char *s;

	if (row->info.type == SL_KEY_ADDR && !row->required && cfg_is_null(v)) {
		free(*(char **)dst);
		*(char **)dst = NULL;
		return;
	}
	if ((s = cfg_want_scalar(c, v, path)) == NULL)
		return;
	switch (row->info.type) {
	case SL_KEY_ADDR:
		if (!cfg_valid_addr(s)) {
			cfg_err_at(c, &v->start_mark,
			    "%s: '%s' is not host:port or [v6]:port", path, s);
			return;
		}
		free(*(char **)dst);
		*(char **)dst = cfg_strdup(c, s);
		return;
	case SL_KEY_STRING:
		free(*(char **)dst);
		*(char **)dst = cfg_strdup(c, s);
		return;
	case SL_KEY_SIZE:
	case SL_KEY_DURATION:
	case SL_KEY_INT:
	case SL_KEY_DECIMAL:
		set_number(c, row, path, v, s, dst);
		return;
	case SL_KEY_WORKERS:
	case SL_KEY_LOGLEVEL:
	case SL_KEY_REDIS_DOWN:
	case SL_KEY_BOOL:
		set_word(c, row, path, v, s, dst);
		return;
	case SL_KEY_LOGDEST:
		if (c->check_files && strcmp(s, "off") != 0 &&
		    strcmp(s, "stderr") != 0 && !log_dest_opens(c, v, path, s))
			return;
		free(*(char **)dst);
		*(char **)dst = strcmp(s, "off") == 0 ? NULL : cfg_strdup(c, s);
		return;
	default:
		return;
	}
}
