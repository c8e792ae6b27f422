/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Configuration: YAML (libyaml document API) -> struct sl_config.
 *
 * Every key lives in one table (keys[] below) with its type, default, range
 * and help; the parser, `sluice -t` and the man page check are driven by it.
 * Every problem is reported as FILE:LINE:COL: message, all of them, not just
 * the first. Unknown keys, duplicate keys and aliases are errors: a misspelt
 * limit must never silently become "unlimited".
 *
 * This file holds the key table, the error reporter, the top level and
 * the load; the value parsers, the YAML walking and the upstreams:,
 * models: and tenants: sections are in config_*.c, layered as
 * config_int.h says.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
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
static const struct key_row keys[] = {
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
	    "not resolved)." },
	    0, 0, 0, OFF(cluster.redis) },
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

const struct sl_key_info *
sl_config_keys(void)
{
	static struct sl_key_info infos[sizeof(keys) / sizeof(keys[0])];
	size_t i;

	if (infos[0].path == NULL)
		for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
			infos[i] = keys[i].info;
	return infos;
}

const struct key_row *
cfg_find_key(const char *path)
{
	const struct key_row *k;

	for (k = keys; k->info.path != NULL; k++)
		if (strcmp(k->info.path, path) == 0)
			return k;
	return NULL;
}

/* ---- errors ---------------------------------------------------------- */

void
sl_errors_free(struct sl_errors *e)
{
	size_t i;

	for (i = 0; i < e->n; i++)
		free(e->msg[i]);
	free(e->msg);
	e->msg = NULL;
	e->n = 0;
}

void
sl_errors_print(const struct sl_errors *e, FILE *fp)
{
	size_t i;

	for (i = 0; i < e->n; i++)
		fprintf(fp, "%s\n", e->msg[i]);
}

static void
err_add(struct sl_errors *e, char *msg)
{
	char **nm;

	if (msg == NULL)
		return;
	/* Capacity is the next power of two: a file with n errors costs O(n). */
	if ((e->n & (e->n - 1)) == 0) {
		nm = realloc(e->msg, (e->n ? 2 * e->n : 1) * sizeof(*nm));
		if (nm == NULL) {
			free(msg);
			return;
		}
		e->msg = nm;
	}
	e->msg[e->n++] = msg;
}

void
cfg_err_at(struct ctx *c, const yaml_mark_t *m, const char *fmt, ...)
{
	char body[512], *msg;
	va_list ap;

	/*
	 * An aliased value was reported once, where the alias is; what its
	 * copy would say again at the anchor's position is noise.
	 */
	if (c->quiet)
		return;

	va_start(ap, fmt);
	vsnprintf(body, sizeof(body), fmt, ap);
	va_end(ap);
	/* One problem, one line: a value quoted in it may hold controls. */
	for (msg = body; *msg != '\0'; msg++)
		if ((unsigned char)*msg < 0x20 || *msg == 0x7f)
			*msg = '?';
	if (asprintf(&msg, "%s:%zu:%zu: %s", c->name,
	    m ? m->line + 1 : 1, m ? m->column + 1 : 1, body) < 0)
		return;
	err_add(c->errs, msg);
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

/* ---- the cluster: and tls: blocks, once read --------------------------- */

/* After the top level is read: what only the whole `cluster:` tells. */
static void
check_cluster(struct ctx *c, yaml_node_t *root)
{
	struct sl_cluster_conf *cl = &c->cfg->cluster;
	yaml_node_t *map, *hb;
	char host[256];

	map = cfg_find_child(c, root, "cluster");
	if (map == NULL || map->type != YAML_MAPPING_NODE)
		return;
	cl->enabled = 1;
	if (cl->redis == NULL)
		cfg_err_at(c, &map->start_mark, "cluster: missing required key 'redis'");
	if (cl->heartbeat_ms * 3 > cl->lease_ttl_ms) {
		/* Absent, the default heartbeat: the lease_ttl set is the cause. */
		if ((hb = cfg_find_child(c, map, "heartbeat")) == NULL &&
		    (hb = cfg_find_child(c, map, "lease_ttl")) == NULL)
			hb = map;
		cfg_err_at(c, &hb->start_mark,
		    "cluster.heartbeat: %" PRIu64 "ms must be at most lease_ttl / 3 "
		    "(%" PRIu64 "ms)", cl->heartbeat_ms, cl->lease_ttl_ms / 3);
	}
	if (cl->node == NULL) {
		size_t i;

		if (gethostname(host, sizeof(host) - 1) == -1)
			strcpy(host, "sluice");
		host[sizeof(host) - 1] = '\0';
		/* The short host name, in the characters a node name allows. */
		host[strcspn(host, ".")] = '\0';
		for (i = 0; host[i] != '\0'; i++)
			if (!isalnum((unsigned char)host[i]) && host[i] != '_' &&
			    host[i] != '-')
				host[i] = '-';
		if (i == 0)
			strcpy(host, "sluice");
		host[64] = '\0';
		cl->node = cfg_strdup(c, host);
	}
	if (cl->password != NULL && cl->password[0] == '\0') {
		free(cl->password);
		cl->password = NULL;
	}
}

/* tls.alpn: a list of h2 and http/1.1, each once, in preference order. */
static void
parse_alpn(struct ctx *c, yaml_node_t *v, const char *path)
{
	struct sl_tls_conf *t = &c->cfg->tls;
	yaml_node_item_t *it;
	int n = 0;

	if (v->type != YAML_SEQUENCE_NODE) {
		cfg_err_at(c, &v->start_mark, "%s: expected a list, got %s", path,
		    cfg_type_name(v));
		return;
	}
	t->alpn[0] = t->alpn[1] = SL_ALPN_NONE;
	for (it = v->data.sequence.items.start; it < v->data.sequence.items.top;
	    it++) {
		yaml_node_t *w = cfg_node(c, *it);
		const char *s;
		int p;

		if (w == NULL || (s = cfg_want_scalar(c, w, path)) == NULL)
			continue;
		if (strcmp(s, "h2") == 0)
			p = SL_ALPN_H2;
		else if (strcmp(s, "http/1.1") == 0)
			p = SL_ALPN_HTTP11;
		else {
			cfg_err_at(c, &w->start_mark,
			    "%s: '%s' must be h2 or http/1.1", path, s);
			continue;
		}
		if (n > 0 && t->alpn[0] == p) {
			cfg_err_at(c, &w->start_mark, "%s: '%s' is listed twice", path, s);
			continue;
		}
		t->alpn[n++] = p;
	}
	if (n == 0 && v->data.sequence.items.start == v->data.sequence.items.top)
		cfg_err_at(c, &v->start_mark, "%s: at least one protocol is required",
		    path);
}

/*
 * After the top level is read: the whole `tls:` block. With files checked
 * (sluice -t, start, reload) the certificate and key are loaded into the
 * context the listener will use, so a pair that cannot serve fails here,
 * at the line that names it.
 */
static void
check_tls(struct ctx *c, yaml_node_t *root)
{
	struct sl_tls_conf *t = &c->cfg->tls;
	yaml_node_t *map, *at;
	char err[PATH_MAX + 256], warn[PATH_MAX + 256];

	map = cfg_find_child(c, root, "tls");
	if (map == NULL || map->type != YAML_MAPPING_NODE)
		return;
	t->enabled = 1;
	if (t->alpn[0] == SL_ALPN_NONE) {
		t->alpn[0] = SL_ALPN_H2;
		t->alpn[1] = SL_ALPN_HTTP11;
	}
	if (t->cert == NULL)
		cfg_err_at(c, &map->start_mark, "tls: missing required key 'cert'");
	if (t->key == NULL)
		cfg_err_at(c, &map->start_mark, "tls: missing required key 'key'");
	if (t->min_version != NULL && strcmp(t->min_version, "TLSv1.2") != 0 &&
	    strcmp(t->min_version, "TLSv1.3") != 0) {
		at = cfg_find_child(c, map, "min_version");
		cfg_err_at(c, at != NULL ? &at->start_mark : &map->start_mark,
		    "tls.min_version: '%s' must be TLSv1.2 or TLSv1.3",
		    t->min_version);
	}
	if (!c->check_files || t->cert == NULL || t->key == NULL ||
	    c->errs->n > 0)
		return;
	t->ctx = sl_tls_ctx_new(t, err, sizeof(err), warn, sizeof(warn));
	if (t->ctx == NULL) {
		at = cfg_find_child(c, map, strncmp(err, "tls.key", 7) == 0 ?
		    "key" : "cert");
		cfg_err_at(c, at != NULL ? &at->start_mark : &map->start_mark, "%s",
		    err);
		return;
	}
	if (warn[0] != '\0')
		t->warning = cfg_strdup(c, warn);
}

/* ---- top level ------------------------------------------------------- */

struct map_arg {
	const char *prefix;       /* "" or "timeouts" */
	unsigned char *present;   /* per key row */
};

static void
top_pair(struct ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg)
{
	struct map_arg *a = arg;
	const struct key_row *row;
	char path[256];
	int ok;

	if (a->prefix[0] != '\0')
		snprintf(path, sizeof(path), "%s.%s", a->prefix, cfg_scalar(k));
	else
		snprintf(path, sizeof(path), "%s", cfg_scalar(k));
	row = strchr(cfg_scalar(k), '.') == NULL ? cfg_find_key(path) : NULL;
	if (row == NULL || strchr(row->info.path, '*') != NULL) {
		cfg_err_at(c, &k->start_mark, "unknown key '%s'", path);
		return;
	}
	a->present[row - keys] = 1;
	if (strcmp(path, "tls.alpn") == 0) {
		parse_alpn(c, v, path);
		return;
	}
	if (row->info.type != SL_KEY_MAP) {
		cfg_set_value(c, row, path, v, (char *)c->cfg + row->off);
		if (row->off == OFF(cluster.redis) && c->cfg->cluster.redis != NULL &&
		    !cfg_valid_redis_addr(c->cfg->cluster.redis))
			cfg_err_at(c, &v->start_mark,
			    "%s: '%s' is not IP:port, [v6]:port or unix:/path (host "
			    "names are not resolved: hiredis 0.14 would block on it)",
			    path, c->cfg->cluster.redis);
		if (row->off == OFF(cluster.node) && c->cfg->cluster.node != NULL &&
		    !cfg_valid_node_name(c->cfg->cluster.node))
			cfg_err_at(c, &v->start_mark,
			    "%s: '%s' must be 1-64 of A-Z a-z 0-9 . _ -", path,
			    c->cfg->cluster.node);
		return;
	}
	cfg_require_mapping(c, v, path, &ok);
	if (!ok)
		return;
	if (strcmp(path, "upstreams") == 0 || strcmp(path, "tenants") == 0 ||
	    strcmp(path, "models") == 0)
		return;   /* second pass: tenants need all upstreams first */
	{
		struct map_arg sub = { path, a->present };

		cfg_each_pair(c, v, top_pair, &sub);
	}
}

static void
set_defaults(struct sl_config *cfg)
{
	const struct key_row *k;

	for (k = keys; k->info.path != NULL; k++) {
		void *dst;
		uint64_t u;

		if (k->off == NOOFF || k->info.def == NULL)
			continue;
		dst = (char *)cfg + k->off;
		switch (k->info.type) {
		case SL_KEY_SIZE:
			if (sl_parse_size(k->info.def, &u) == 0)
				*(uint64_t *)dst = u;
			break;
		case SL_KEY_DURATION:
			if (sl_parse_duration_ms(k->info.def, &u) == 0)
				*(uint64_t *)dst = u;
			break;
		case SL_KEY_INT:
			*(uint64_t *)dst = strtoull(k->info.def, NULL, 10);
			break;
		case SL_KEY_WORKERS:
			cfg->workers = SL_WORKERS_AUTO;
			break;
		case SL_KEY_LOGLEVEL:
			cfg->log_level = SL_LOG_INFO;
			break;
		case SL_KEY_BOOL:
			*(int *)dst = strcmp(k->info.def, "true") == 0;
			break;
		default:
			break;
		}
	}
}

/*
 * Aliases are refused (they can build cycles and exponential documents,
 * and a config has no use for them). The document API keeps no
 * position for an alias, so find them in the event stream first.
 *
 * Nesting is bounded here too, before libyaml builds a document: its
 * scanner costs O(depth) per token, so 200 KB of "[[[[" took 42 s. A
 * configuration needs 4 levels. Past SL_CONFIG_MAX_DEPTH the scan stops
 * and *fatal is set: the file is not read further.
 */
static int
prescan(struct ctx *c, const char *data, size_t len, int *fatal)
{
	yaml_parser_t p;
	yaml_event_t ev;
	int found = 0, done = 0, depth = 0;

	*fatal = 0;
	if (!yaml_parser_initialize(&p))
		return 0;
	yaml_parser_set_input_string(&p, (const unsigned char *)data, len);
	while (!done) {
		if (!yaml_parser_parse(&p, &ev))
			break;   /* syntax errors are reported by the real load */
		switch (ev.type) {
		case YAML_ALIAS_EVENT:
			/* An anchor alone is harmless; only its use is refused. */
			cfg_err_at(c, &ev.start_mark, "aliases are not allowed (*%s)",
			    (const char *)ev.data.alias.anchor);
			found++;
			break;
		case YAML_SEQUENCE_START_EVENT:
		case YAML_MAPPING_START_EVENT:
			if (++depth > SL_CONFIG_MAX_DEPTH) {
				cfg_err_at(c, &ev.start_mark, "nesting deeper than %d "
				    "levels (lists and mappings inside each other)",
				    SL_CONFIG_MAX_DEPTH);
				found++;
				*fatal = 1;
				done = 1;
			}
			break;
		case YAML_SEQUENCE_END_EVENT:
		case YAML_MAPPING_END_EVENT:
			depth--;
			break;
		case YAML_STREAM_END_EVENT:
			done = 1;
			break;
		default:
			break;
		}
		yaml_event_delete(&ev);
	}
	yaml_parser_delete(&p);
	return found;
}

/*
 * libyaml gives a reader error (bad UTF-8, a control character) as a byte
 * offset only: turn it into the line and column (in characters, as the
 * other marks count) of that byte.
 */
static yaml_mark_t
offset_mark(const struct ctx *c, size_t offset)
{
	yaml_mark_t m;
	size_t i = 0;

	memset(&m, 0, sizeof(m));
	if (offset > c->len)
		offset = c->len;
	if (offset >= 3 && memcmp(c->data, "\xef\xbb\xbf", 3) == 0)
		i = 3;   /* a BOM is not a character of the first line */
	for (; i < offset; i++) {
		unsigned char b = c->data[i];

		if (b == '\n' || (b == '\r' && (i + 1 >= c->len ||
		    c->data[i + 1] != '\n'))) {
			m.line++;
			m.column = 0;
		} else if (b != '\r' && (b & 0xc0) != 0x80)
			m.column++;
	}
	m.index = offset;
	return m;
}

/* Report why yaml_parser_load failed, where it failed. */
static void
parser_error(struct ctx *c, yaml_parser_t *parser)
{
	const char *problem = parser->problem ? parser->problem : "syntax error";
	yaml_mark_t m = parser->problem_mark;

	if (parser->error == YAML_READER_ERROR) {
		m = offset_mark(c, parser->problem_offset);
		if (parser->problem_value == -1)
			cfg_err_at(c, &m, "%s", problem);
		else if (strstr(problem, "octet") != NULL)
			cfg_err_at(c, &m, "%s (byte 0x%02x)", problem,
			    (unsigned)parser->problem_value & 0xff);
		else
			cfg_err_at(c, &m, "%s (U+%04X)", problem,
			    (unsigned)parser->problem_value);
	} else if (parser->context != NULL)
		cfg_err_at(c, &m, "%s %s", problem, parser->context);
	else
		cfg_err_at(c, &m, "%s", problem);
}

static int
load(struct ctx *c, yaml_parser_t *parser)
{
	yaml_document_t doc;
	yaml_node_t *root, *n;
	struct map_arg top;
	unsigned char present[sizeof(keys) / sizeof(keys[0])];
	const struct key_row *k;
	size_t i;

	if (!yaml_parser_load(parser, &doc)) {
		parser_error(c, parser);
		return -1;
	}
	c->doc = &doc;
	root = yaml_document_get_root_node(&doc);
	if (root == NULL) {
		cfg_err_at(c, NULL, "empty configuration");
		yaml_document_delete(&doc);
		return -1;
	}
	c->nnodes = (size_t)(doc.nodes.top - doc.nodes.start);
	c->seen = calloc(c->nnodes ? c->nnodes : 1, 1);
	if (c->seen == NULL) {
		cfg_err_at(c, NULL, "out of memory");
		yaml_document_delete(&doc);
		return -1;
	}
	c->seen[0] = 1;
	if (root->type != YAML_MAPPING_NODE) {
		cfg_err_at(c, &root->start_mark, "the configuration must be a mapping, got %s",
		    cfg_type_name(root));
		goto out;
	}

	memset(present, 0, sizeof(present));
	top.prefix = "";
	top.present = present;
	cfg_each_pair(c, root, top_pair, &top);

	/* Upstreams, then tenants (which refer to upstreams). */
	if ((n = cfg_find_child(c, root, "upstreams")) != NULL &&
	    n->type == YAML_MAPPING_NODE)
		cfg_parse_upstreams(c, n);
	if ((n = cfg_find_child(c, root, "models")) != NULL) {
		c->models_section = 1;
		if (n->type == YAML_MAPPING_NODE)
			cfg_parse_models(c, n);
	}
	if ((n = cfg_find_child(c, root, "tenants")) != NULL &&
	    n->type == YAML_MAPPING_NODE)
		cfg_parse_tenants(c, n);

	check_cluster(c, root);
	check_tls(c, root);
	if (!c->cfg->usage.enabled) {
		/* A budget nobody counts for would silently never refuse. */
		for (i = 0; i < c->cfg->ntenants; i++)
			if (c->cfg->tenants[i].tokens_per_minute > 0) {
				yaml_node_t *u = cfg_find_child(c, root, "usage"), *e;

				e = u != NULL && u->type == YAML_MAPPING_NODE ?
				    cfg_find_child(c, u, "enabled") : NULL;
				cfg_err_at(c, e != NULL ? &e->start_mark : &root->start_mark,
				    "usage.enabled: false, but tenant '%s' has "
				    "tokens_per_minute %d: budgets need usage",
				    c->cfg->tenants[i].name,
				    (int)c->cfg->tenants[i].tokens_per_minute);
				break;
			}
	}

	for (k = keys; k->info.path != NULL; k++)
		if (k->required && strchr(k->info.path, '*') == NULL &&
		    !present[k - keys])
			cfg_err_at(c, &root->start_mark, "missing required key '%s'",
			    k->info.path);

	/* A stream buffer must hold at least one libcurl read plus framing. */
	(void)i;
out:
	free(c->seen);
	c->seen = NULL;
	yaml_document_delete(&doc);
	c->doc = NULL;

	/* Only one document per file. */
	if (c->errs->n == 0) {
		yaml_document_t extra;

		if (!yaml_parser_load(parser, &extra)) {
			parser_error(c, parser);
		} else {
			if (yaml_document_get_root_node(&extra) != NULL)
				cfg_err_at(c, &extra.start_mark,
				    "only one YAML document is allowed");
			yaml_document_delete(&extra);
		}
	}
	return c->errs->n == 0 ? 0 : -1;
}

/* Position of a message "NAME:LINE:COL: ..." for sorting. */
static void
msg_pos(const char *msg, size_t namelen, unsigned long *line, unsigned long *col)
{
	char *end;

	*line = *col = 0;
	if (strlen(msg) <= namelen + 1)
		return;
	*line = strtoul(msg + namelen + 1, &end, 10);
	if (*end == ':')
		*col = strtoul(end + 1, NULL, 10);
}

struct msg_key {
	unsigned long line, col;
	size_t seq;             /* order of insertion: keeps the sort stable */
	char *msg;
};

static int
msg_key_cmp(const void *x, const void *y)
{
	const struct msg_key *a = x, *b = y;

	if (a->line != b->line)
		return a->line < b->line ? -1 : 1;
	if (a->col != b->col)
		return a->col < b->col ? -1 : 1;
	return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/*
 * Report problems in file order, those at one position in the order they
 * were found. O(n log n): a file may hold 100k repeated keys.
 */
static void
sort_errors(struct sl_errors *e, const char *name)
{
	size_t i, nl = strlen(name);
	struct msg_key *k;

	if (e->n < 2 || (k = calloc(e->n, sizeof(*k))) == NULL)
		return;
	for (i = 0; i < e->n; i++) {
		msg_pos(e->msg[i], nl, &k[i].line, &k[i].col);
		k[i].seq = i;
		k[i].msg = e->msg[i];
	}
	qsort(k, e->n, sizeof(*k), msg_key_cmp);
	for (i = 0; i < e->n; i++)
		e->msg[i] = k[i].msg;
	free(k);
}

static int
load_buffer(const char *name, const char *data, size_t len, int check_files,
    struct sl_config **out, struct sl_errors *errs)
{
	yaml_parser_t parser;
	struct ctx c;
	struct sl_config *cfg;
	int rc, fatal;

	*out = NULL;
	memset(&c, 0, sizeof(c));
	c.name = name;
	c.errs = errs;
	c.data = (const unsigned char *)data;
	c.len = len;
	c.check_files = check_files;
	cfg = calloc(1, sizeof(*cfg));
	if (cfg == NULL || (cfg->file = strdup(name)) == NULL) {
		free(cfg);
		cfg_err_at(&c, NULL, "out of memory");
		return -1;
	}
	set_defaults(cfg);
	cfg->loaded_at = (int64_t)time(NULL);
	c.cfg = cfg;
	if (!yaml_parser_initialize(&parser)) {
		cfg_err_at(&c, NULL, "cannot initialise the YAML parser");
		sl_config_free(cfg);
		return -1;
	}
	yaml_parser_set_input_string(&parser, (const unsigned char *)data, len);
	rc = prescan(&c, data, len, &fatal) > 0 ? -1 : 0;
	if (!fatal && load(&c, &parser) == -1)
		rc = -1;
	yaml_parser_delete(&parser);
	sort_errors(errs, name);
	if (rc == -1 || errs->n > 0) {
		sl_config_free(cfg);
		return -1;
	}
	*out = cfg;
	return 0;
}

int
sl_config_load_buffer(const char *name, const char *data, size_t len,
    struct sl_config **out, struct sl_errors *errs)
{
	return load_buffer(name, data, len, 0, out, errs);
}

static const char *
file_kind(mode_t mode)
{
	if (S_ISDIR(mode))
		return "a directory";
	if (S_ISFIFO(mode))
		return "a FIFO";
	if (S_ISCHR(mode))
		return "a character device";
	if (S_ISBLK(mode))
		return "a block device";
	if (S_ISSOCK(mode))
		return "a socket";
	return "a special file";
}

struct load_apart {
	const char *path;
	struct sl_config **out;
	struct sl_errors *errs;
	int rc;
};

static void *
load_apart(void *arg)
{
	struct load_apart *la = arg;

	la->rc = sl_config_load_file(la->path, la->out, la->errs);
	return NULL;
}

int
sl_config_load_file_apart(const char *path, struct sl_config **out,
    struct sl_errors *errs)
{
	struct load_apart la = { path, out, errs, -1 };
	pthread_t th;
	sigset_t all, old;

	/* Signals stay with the main thread, which waits here anyway. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	if (pthread_create(&th, NULL, load_apart, &la) != 0) {
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		return sl_config_load_file(path, out, errs);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_join(th, NULL);
	return la.rc;
}

int
sl_config_load_file(const char *path, struct sl_config **out,
    struct sl_errors *errs)
{
	FILE *fp;
	char *data = NULL, *nd, *msg;
	size_t len = 0, cap = 0, n;
	struct stat st;
	int rc, fd;

	*out = NULL;
	/*
	 * O_NONBLOCK: opening a FIFO must not wait for a writer. Only a
	 * regular file is read; a FIFO or a device could block or never end.
	 */
	fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd == -1) {
		if (asprintf(&msg, "%s:1:1: cannot open: %s", path,
		    strerror(errno)) >= 0)
			err_add(errs, msg);
		return -1;
	}
	if (fstat(fd, &st) == -1) {
		if (asprintf(&msg, "%s:1:1: cannot stat: %s", path,
		    strerror(errno)) >= 0)
			err_add(errs, msg);
		close(fd);
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		if (asprintf(&msg, "%s:1:1: not a regular file (%s)", path,
		    file_kind(st.st_mode)) >= 0)
			err_add(errs, msg);
		close(fd);
		return -1;
	}
	fp = fdopen(fd, "r");
	if (fp == NULL) {
		if (asprintf(&msg, "%s:1:1: cannot open: %s", path,
		    strerror(errno)) >= 0)
			err_add(errs, msg);
		close(fd);
		return -1;
	}
	for (;;) {
		if (len == cap) {
			/* One byte past 16 MiB tells a file of exactly 16 MiB from a larger one. */
			nd = NULL;
			if (cap <= 16 * MIB) {
				cap = cap ? cap * 2 : 8192;
				if (cap > 16 * MIB)
					cap = 16 * MIB + 1;
				nd = realloc(data, cap);
			}
			if (nd == NULL) {
				if (asprintf(&msg, "%s:1:1: file too large or out of memory",
				    path) >= 0)
					err_add(errs, msg);
				free(data);
				fclose(fp);
				return -1;
			}
			data = nd;
		}
		n = fread(data + len, 1, cap - len, fp);
		len += n;
		if (n == 0)
			break;
	}
	if (ferror(fp)) {
		if (asprintf(&msg, "%s:1:1: read error: %s", path,
		    strerror(errno)) >= 0)
			err_add(errs, msg);
		free(data);
		fclose(fp);
		return -1;
	}
	fclose(fp);
	rc = load_buffer(path, data, len, 1, out, errs);
	free(data);
	return rc;
}

int
sl_config_permission_warning(const char *path, char *msg, size_t len)
{
	struct stat st;

	if (stat(path, &st) == -1 || !(st.st_mode & S_IROTH))
		return 0;
	snprintf(msg, len, "%s holds API keys and is readable by others "
	    "(chmod o-r)", path);
	return 1;
}

void
sl_config_free(struct sl_config *cfg)
{
	size_t i, j;

	if (cfg == NULL)
		return;
	free(cfg->file);
	free(cfg->listen);
	free(cfg->admin_listen);
	free(cfg->access_log);
	free(cfg->cluster.redis);
	free(cfg->cluster.password);
	free(cfg->cluster.node);
	free(cfg->tls.cert);
	free(cfg->tls.key);
	free(cfg->tls.min_version);
	free(cfg->tls.warning);
	sl_tls_ctx_free(cfg->tls.ctx);
	for (i = 0; i < cfg->nupstreams; i++) {
		free(cfg->upstreams[i].name);
		free(cfg->upstreams[i].url);
		free(cfg->upstreams[i].api_key);
		for (j = 0; j < cfg->upstreams[i].nreplicas; j++)
			free(cfg->upstreams[i].replicas[j].url);
		free(cfg->upstreams[i].replicas);
		free(cfg->upstreams[i].health.path);
		free(cfg->upstreams[i].load_metrics.path);
	}
	free(cfg->upstreams);
	for (i = 0; i < cfg->ntenants; i++) {
		for (j = 0; j < cfg->tenants[i].nkeys; j++)
			free(cfg->tenants[i].keys[j]);
		free(cfg->tenants[i].keys);
		free(cfg->tenants[i].name);
		free(cfg->tenants[i].upstream);
		free(cfg->tenants[i].allowed);
	}
	free(cfg->tenants);
	for (i = 0; i < cfg->nmodels; i++) {
		free(cfg->models[i].name);
		for (j = 0; j < cfg->models[i].naliases; j++)
			free(cfg->models[i].aliases[j]);
		free(cfg->models[i].aliases);
		for (j = 0; j < cfg->models[i].ntargets; j++) {
			free(cfg->models[i].targets[j].upstream);
			free(cfg->models[i].targets[j].model);
		}
		free(cfg->models[i].targets);
		free(cfg->models[i].fallback);
	}
	free(cfg->models);
	free(cfg->model_names);
	free(cfg);
}
