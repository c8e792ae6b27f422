/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * fuzz_config: the configuration loader, bytes -> config or errors.
 *
 * sl_config_load_buffer() must either return 0 with a config that keeps
 * every promise of sl_config.h and the key table (ranges, required keys,
 * tenants with keys and a valid upstream, keys unique across tenants), or
 * -1 with no config and at least one message of the form
 * "NAME:LINE:COL: message", LINE and COL positive, in file order. Leaks of
 * either path show up through LeakSanitizer.
 */
#include "config.h"

#include <inttypes.h>
#include <yaml.h>

#include "sl_config.h"
#include "fuzz.h"

#define NAME "fuzz.yaml"

/*
 * Every row of sl_config_keys() is checked, with the range the row states
 * (its `range` text, read here: "16KiB-1GiB", "1ms-10m", "1-100", "1.0-100",
 * "1-64 entries", "error, warn, info, debug" as 0-3, "connect, busy, empty"
 * as a 3-bit set, "1-64 of A-Z a-z 0-9 . _ -" as a length and a charset...),
 * applied to the value the loader stored for it. The table below only says
 * where each row's value lives and when it applies; a row of the key table
 * missing from it fails every input ("unchecked-key"), so a new key cannot
 * go unchecked.
 */

enum scope { TOP, UPSTREAM, REPLICA, TENANT, MODEL, TARGET };
enum when { ALWAYS, IF_CLUSTER, IF_SENTINELS, IF_URL, IF_HEALTH, IF_LOADM, IF_TLS };
enum kind {
	K_NUM,        /* range "LO-HI" in the row's unit */
	K_ONE_OF,     /* range lists N words: value in 0..N-1 */
	K_BITS,       /* range lists N words: a set of them, value < 2^N */
	K_AT_LEAST_ONE,
	K_ADDR,       /* host:port or [v6]:port */
	K_URL,
	K_PATH,       /* a path starting with / */
	K_NAME,       /* "LO-HI of CHARSET" */
	K_REDIS,      /* cluster.redis: present unless sentinels are */
	K_SENTINELS,  /* cluster.sentinels: 0 with redis, else 1-16 addresses */
	K_LOGDEST,
	K_KEYS,
	K_UPSTREAM_REF,
	K_NO_CRLF,    /* sent in a header line */
	K_ALIASES,    /* each name finds this model */
	K_FALLBACK,   /* indices of other models */
	K_TARGET_UPSTREAM,
	K_TENANT_MODELS,
	K_ANY,        /* a string the loader takes as it is */
	K_TLS_FILE,   /* a path, present whenever tls: is */
	K_MAPPING     /* the rows below it are checked */
};

struct where {
	const char *path;
	enum scope scope;
	enum when when;
	enum kind kind;
	int64_t (*num)(const struct sl_config *, size_t, size_t);
	const char *(*str)(const struct sl_config *, size_t, size_t);
};

#define GETTER(name, type, expr) \
	static type name(const struct sl_config *c, size_t a, size_t b) \
	{ (void)c; (void)a; (void)b; return (type)(expr); }
#define NUM(name, expr) GETTER(n_##name, int64_t, expr)
#define STR(name, expr) GETTER(s_##name, const char *, expr)
#define UP (&c->upstreams[a])
#define REP (&c->upstreams[a].replicas[b])
#define TEN (&c->tenants[a])
#define MOD (&c->models[a])
#define TGT (&c->models[a].targets[b])

NUM(workers, c->workers)
NUM(stream_buffer, c->stream_buffer)
NUM(drain_timeout, c->drain_timeout_ms)
NUM(log_level, c->log_level)
NUM(upstream_connect, c->timeouts.upstream_connect_ms)
NUM(upstream_first_byte, c->timeouts.upstream_first_byte_ms)
NUM(upstream_idle, c->timeouts.upstream_idle_ms)
NUM(client_header, c->timeouts.client_header_ms)
NUM(client_body, c->timeouts.client_body_ms)
NUM(client_stall, c->timeouts.client_stall_ms)
NUM(keepalive, c->timeouts.keepalive_ms)
NUM(max_header_bytes, c->limits.max_header_bytes)
NUM(max_body_bytes, c->limits.max_body_bytes)
NUM(max_connections, c->limits.max_connections)
NUM(upstream_rcvbuf, c->limits.upstream_rcvbuf)
NUM(client_sndbuf, c->limits.client_sndbuf)
NUM(h2_max_streams, c->limits.h2_max_streams)
NUM(max_tenants, c->limits.max_tenants)
NUM(max_models, c->limits.max_models)
NUM(max_upstreams, c->limits.max_upstreams)
NUM(tls_enabled, c->tls.enabled)
/* TLSv1.2 (absent too) is 0, TLSv1.3 is 1: the range's word order. */
NUM(tls_min_version, c->tls.min_version != NULL &&
    strcmp(c->tls.min_version, "TLSv1.3") == 0)
/* h2 is bit 0, http/1.1 bit 1, as the range lists them. */
NUM(tls_alpn, (c->tls.alpn[0] ? 1 << (c->tls.alpn[0] - 1) : 0) |
    (c->tls.alpn[1] ? 1 << (c->tls.alpn[1] - 1) : 0))
STR(tls_cert, c->tls.cert)
STR(tls_key, c->tls.key)
NUM(cluster_enabled, c->cluster.enabled)
NUM(lease_ttl, c->cluster.lease_ttl_ms)
NUM(heartbeat, c->cluster.heartbeat_ms)
NUM(cluster_timeout, c->cluster.timeout_ms)
NUM(on_redis_down, c->cluster.on_redis_down)
NUM(usage_enabled, c->usage.enabled)
NUM(usage_inject, c->usage.inject)
NUM(nupstreams, c->nupstreams)
NUM(nreplicas, UP->nreplicas)
NUM(weight, REP->weight)
NUM(replica_max_streams, REP->max_streams)
NUM(balance, UP->balance)
NUM(block, UP->affinity.block)
NUM(max_imbalance, UP->affinity.max_imbalance)
NUM(loadm_enabled, UP->load_metrics.enabled)
NUM(loadm_interval, UP->load_metrics.interval_ms)
NUM(retries, UP->retries)
NUM(retry_on, UP->retry_on)
NUM(busy_max, UP->busy_max_ms)
NUM(ntargets, MOD->ntargets)
NUM(target_weight, TGT->weight)
STR(target_upstream, TGT->upstream)
STR(target_model, TGT->model)
NUM(health_enabled, UP->health.enabled)
NUM(health_interval, UP->health.interval_ms)
NUM(health_timeout, UP->health.timeout_ms)
NUM(fall, UP->health.fall)
NUM(rise, UP->health.rise)
NUM(queue_enabled, UP->queue.enabled)
NUM(queue_max, UP->queue.max)
NUM(queue_timeout, UP->queue.timeout_ms)
NUM(queue_fairness, UP->queue.fairness)
NUM(inject_priority, UP->inject_priority)
NUM(tenant_weight, TEN->weight)
NUM(tenant_priority, TEN->priority)
NUM(eject_failures, UP->eject.failures)
NUM(eject_duration, UP->eject.duration_ms)
NUM(eject_max_percent, UP->eject.max_percent)
NUM(raff_max, UP->response_affinity.max)
NUM(raff_ttl, UP->response_affinity.ttl_ms)
NUM(ntenants, c->ntenants)
NUM(max_streams, TEN->max_streams)
NUM(retry_after, TEN->retry_after)
NUM(tokens_per_minute, TEN->tokens_per_minute)
STR(listen, c->listen)
STR(admin_listen, c->admin_listen)
STR(access_log, c->access_log)
STR(redis, c->cluster.redis)
STR(password, c->cluster.password)
STR(node, c->cluster.node)
STR(master_name, c->cluster.master_name)
STR(sentinel_password, c->cluster.sentinel_password)
NUM(nsentinels, c->cluster.nsentinels)
STR(url, UP->url)
STR(replica_url, REP->url)
STR(api_key, UP->api_key)
STR(loadm_path, UP->load_metrics.path)
STR(health_path, UP->health.path)
STR(upstream, TEN->upstream)

static const struct where wheres[] = {
	{ "listen", TOP, ALWAYS, K_ADDR, NULL, s_listen },
	{ "workers", TOP, ALWAYS, K_NUM, n_workers, NULL },
	{ "admin_listen", TOP, ALWAYS, K_ADDR, NULL, s_admin_listen },
	{ "stream_buffer", TOP, ALWAYS, K_NUM, n_stream_buffer, NULL },
	{ "drain_timeout", TOP, ALWAYS, K_NUM, n_drain_timeout, NULL },
	{ "access_log", TOP, ALWAYS, K_LOGDEST, NULL, s_access_log },
	{ "log_level", TOP, ALWAYS, K_ONE_OF, n_log_level, NULL },
	{ "timeouts", TOP, ALWAYS, K_MAPPING, NULL, NULL },
	{ "timeouts.upstream_connect", TOP, ALWAYS, K_NUM, n_upstream_connect, NULL },
	{ "timeouts.upstream_first_byte", TOP, ALWAYS, K_NUM, n_upstream_first_byte, NULL },
	{ "timeouts.upstream_idle", TOP, ALWAYS, K_NUM, n_upstream_idle, NULL },
	{ "timeouts.client_header", TOP, ALWAYS, K_NUM, n_client_header, NULL },
	{ "timeouts.client_body", TOP, ALWAYS, K_NUM, n_client_body, NULL },
	{ "timeouts.client_stall", TOP, ALWAYS, K_NUM, n_client_stall, NULL },
	{ "timeouts.keepalive", TOP, ALWAYS, K_NUM, n_keepalive, NULL },
	{ "limits", TOP, ALWAYS, K_MAPPING, NULL, NULL },
	{ "limits.max_header_bytes", TOP, ALWAYS, K_NUM, n_max_header_bytes, NULL },
	{ "limits.max_body_bytes", TOP, ALWAYS, K_NUM, n_max_body_bytes, NULL },
	{ "limits.max_connections", TOP, ALWAYS, K_NUM, n_max_connections, NULL },
	{ "limits.upstream_rcvbuf", TOP, ALWAYS, K_NUM, n_upstream_rcvbuf, NULL },
	{ "limits.client_sndbuf", TOP, ALWAYS, K_NUM, n_client_sndbuf, NULL },
	{ "limits.h2_max_streams", TOP, ALWAYS, K_NUM, n_h2_max_streams, NULL },
	{ "limits.max_tenants", TOP, ALWAYS, K_NUM, n_max_tenants, NULL },
	{ "limits.max_models", TOP, ALWAYS, K_NUM, n_max_models, NULL },
	{ "limits.max_upstreams", TOP, ALWAYS, K_NUM, n_max_upstreams, NULL },
	{ "tls", TOP, ALWAYS, K_MAPPING, n_tls_enabled, NULL },
	{ "tls.cert", TOP, IF_TLS, K_TLS_FILE, NULL, s_tls_cert },
	{ "tls.key", TOP, IF_TLS, K_TLS_FILE, NULL, s_tls_key },
	{ "tls.min_version", TOP, ALWAYS, K_ONE_OF, n_tls_min_version, NULL },
	{ "tls.alpn", TOP, IF_TLS, K_BITS, n_tls_alpn, NULL },
	{ "cluster", TOP, ALWAYS, K_MAPPING, n_cluster_enabled, NULL },
	{ "cluster.redis", TOP, IF_CLUSTER, K_REDIS, NULL, s_redis },
	{ "cluster.sentinels", TOP, IF_CLUSTER, K_SENTINELS, n_nsentinels, NULL },
	{ "cluster.master_name", TOP, IF_SENTINELS, K_NAME, NULL, s_master_name },
	{ "cluster.sentinel_password", TOP, IF_CLUSTER, K_ANY, NULL,
	    s_sentinel_password },
	{ "cluster.password", TOP, IF_CLUSTER, K_ANY, NULL, s_password },
	{ "cluster.node", TOP, IF_CLUSTER, K_NAME, NULL, s_node },
	{ "cluster.lease_ttl", TOP, IF_CLUSTER, K_NUM, n_lease_ttl, NULL },
	{ "cluster.heartbeat", TOP, IF_CLUSTER, K_NUM, n_heartbeat, NULL },
	{ "cluster.timeout", TOP, IF_CLUSTER, K_NUM, n_cluster_timeout, NULL },
	{ "cluster.on_redis_down", TOP, IF_CLUSTER, K_ONE_OF, n_on_redis_down, NULL },
	{ "usage", TOP, ALWAYS, K_MAPPING, NULL, NULL },
	{ "usage.enabled", TOP, ALWAYS, K_ONE_OF, n_usage_enabled, NULL },
	{ "usage.inject", TOP, ALWAYS, K_ONE_OF, n_usage_inject, NULL },
	{ "upstreams", TOP, ALWAYS, K_AT_LEAST_ONE, n_nupstreams, NULL },
	{ "upstreams.*.url", UPSTREAM, IF_URL, K_URL, NULL, s_url },
	{ "upstreams.*.replicas", UPSTREAM, ALWAYS, K_NUM, n_nreplicas, NULL },
	{ "upstreams.*.replicas[].url", REPLICA, ALWAYS, K_URL, NULL, s_replica_url },
	{ "upstreams.*.replicas[].weight", REPLICA, ALWAYS, K_NUM, n_weight, NULL },
	{ "upstreams.*.replicas[].max_streams", REPLICA, ALWAYS, K_NUM, n_replica_max_streams,
	    NULL },
	{ "upstreams.*.api_key", UPSTREAM, ALWAYS, K_NO_CRLF, NULL, s_api_key },
	{ "upstreams.*.balance", UPSTREAM, ALWAYS, K_ONE_OF, n_balance, NULL },
	{ "upstreams.*.affinity", UPSTREAM, ALWAYS, K_MAPPING, NULL, NULL },
	{ "upstreams.*.affinity.block", UPSTREAM, ALWAYS, K_NUM, n_block, NULL },
	{ "upstreams.*.affinity.max_imbalance", UPSTREAM, ALWAYS, K_NUM, n_max_imbalance, NULL },
	{ "upstreams.*.load_metrics", UPSTREAM, ALWAYS, K_MAPPING, n_loadm_enabled, NULL },
	{ "upstreams.*.load_metrics.path", UPSTREAM, IF_LOADM, K_PATH, NULL, s_loadm_path },
	{ "upstreams.*.load_metrics.interval", UPSTREAM, IF_LOADM, K_NUM, n_loadm_interval,
	    NULL },
	{ "upstreams.*.retries", UPSTREAM, ALWAYS, K_NUM, n_retries, NULL },
	{ "upstreams.*.retry_on", UPSTREAM, ALWAYS, K_BITS, n_retry_on, NULL },
	{ "upstreams.*.busy_max", UPSTREAM, ALWAYS, K_NUM, n_busy_max, NULL },
	{ "upstreams.*.queue", UPSTREAM, ALWAYS, K_MAPPING, n_queue_enabled, NULL },
	{ "upstreams.*.queue.max", UPSTREAM, ALWAYS, K_NUM, n_queue_max, NULL },
	{ "upstreams.*.queue.timeout", UPSTREAM, ALWAYS, K_NUM, n_queue_timeout, NULL },
	{ "upstreams.*.queue.fairness", UPSTREAM, ALWAYS, K_ONE_OF, n_queue_fairness, NULL },
	{ "upstreams.*.inject_priority", UPSTREAM, ALWAYS, K_ONE_OF, n_inject_priority, NULL },
	{ "upstreams.*.health", UPSTREAM, ALWAYS, K_MAPPING, n_health_enabled, NULL },
	{ "upstreams.*.health.path", UPSTREAM, IF_HEALTH, K_PATH, NULL, s_health_path },
	{ "upstreams.*.health.interval", UPSTREAM, IF_HEALTH, K_NUM, n_health_interval, NULL },
	{ "upstreams.*.health.timeout", UPSTREAM, IF_HEALTH, K_NUM, n_health_timeout, NULL },
	{ "upstreams.*.health.fall", UPSTREAM, IF_HEALTH, K_NUM, n_fall, NULL },
	{ "upstreams.*.health.rise", UPSTREAM, IF_HEALTH, K_NUM, n_rise, NULL },
	{ "upstreams.*.eject", UPSTREAM, ALWAYS, K_MAPPING, NULL, NULL },
	{ "upstreams.*.eject.failures", UPSTREAM, ALWAYS, K_NUM, n_eject_failures, NULL },
	{ "upstreams.*.eject.duration", UPSTREAM, ALWAYS, K_NUM, n_eject_duration, NULL },
	{ "upstreams.*.eject.max_percent", UPSTREAM, ALWAYS, K_NUM, n_eject_max_percent, NULL },
	{ "upstreams.*.response_affinity", UPSTREAM, ALWAYS, K_MAPPING, NULL, NULL },
	{ "upstreams.*.response_affinity.max", UPSTREAM, ALWAYS, K_NUM, n_raff_max, NULL },
	{ "upstreams.*.response_affinity.ttl", UPSTREAM, ALWAYS, K_NUM, n_raff_ttl, NULL },
	{ "tenants", TOP, ALWAYS, K_AT_LEAST_ONE, n_ntenants, NULL },
	{ "tenants.*.keys", TENANT, ALWAYS, K_KEYS, NULL, NULL },
	{ "tenants.*.max_streams", TENANT, ALWAYS, K_NUM, n_max_streams, NULL },
	{ "tenants.*.retry_after", TENANT, ALWAYS, K_NUM, n_retry_after, NULL },
	{ "tenants.*.tokens_per_minute", TENANT, ALWAYS, K_NUM, n_tokens_per_minute, NULL },
	{ "tenants.*.weight", TENANT, ALWAYS, K_NUM, n_tenant_weight, NULL },
	{ "tenants.*.priority", TENANT, ALWAYS, K_NUM, n_tenant_priority, NULL },
	{ "tenants.*.upstream", TENANT, ALWAYS, K_UPSTREAM_REF, NULL, s_upstream },
	{ "tenants.*.models", TENANT, ALWAYS, K_TENANT_MODELS, NULL, NULL },
	{ "models", TOP, ALWAYS, K_MAPPING, NULL, NULL },
	{ "models.*.aliases", MODEL, ALWAYS, K_ALIASES, NULL, NULL },
	{ "models.*.fallback", MODEL, ALWAYS, K_FALLBACK, NULL, NULL },
	{ "models.*.targets", MODEL, ALWAYS, K_NUM, n_ntargets, NULL },
	{ "models.*.targets[].upstream", TARGET, ALWAYS, K_TARGET_UPSTREAM, NULL,
	    s_target_upstream },
	{ "models.*.targets[].model", TARGET, ALWAYS, K_ANY, NULL, s_target_model },
	{ "models.*.targets[].weight", TARGET, ALWAYS, K_NUM, n_target_weight, NULL },
	{ NULL, TOP, ALWAYS, K_ANY, NULL, NULL }
};

/* One bound of a range text, in the row's unit; 0 when it does not parse. */
static int
bound(enum sl_key_type type, const char *s, size_t len, int64_t *out)
{
	char buf[64];
	uint64_t v;
	char *end;
	double d;

	if (len == 0 || len >= sizeof(buf))
		return 0;
	memcpy(buf, s, len);
	buf[len] = '\0';
	switch (type) {
	case SL_KEY_SIZE:
		if (sl_parse_size(buf, &v) != 0)
			return 0;
		break;
	case SL_KEY_DURATION:
		if (strcmp(buf, "0") == 0)
			v = 0;
		else if (sl_parse_duration_ms(buf, &v) != 0)
			return 0;
		break;
	case SL_KEY_DECIMAL:      /* hundredths */
		d = strtod(buf, &end);
		if (*end != '\0')
			return 0;
		v = (uint64_t)(d * 100 + 0.5);
		break;
	default:
		/* An integer may be negative (tenants.*.priority: -100-100). */
		if (buf[0] == '-') {
			*out = strtoll(buf, &end, 10);
			return *end == '\0' && buf[1] >= '0' && buf[1] <= '9';
		}
		v = strtoull(buf, &end, 10);
		if (*end != '\0' || buf[0] < '0' || buf[0] > '9')
			return 0;
	}
	*out = (int64_t)v;
	return 1;
}

/* "LO-HI" at the start of a range text (up to a blank): 1 and the bounds. */
static int
range_of(const struct sl_key_info *k, int64_t *lo, int64_t *hi, const char **rest)
{
	const char *r = k->range, *dash, *e;

	/* The dash between the bounds, not a low bound's minus sign. */
	if (r == NULL || r[0] == '\0' || (dash = strchr(r + 1, '-')) == NULL)
		return 0;
	e = dash + 1 + strcspn(dash + 1, " ");
	if (rest != NULL)
		*rest = e;
	return bound(k->type, r, (size_t)(dash - r), lo) &&
	    bound(k->type == SL_KEY_LIST_OF_MAPS ? SL_KEY_INT : k->type, dash + 1,
	    (size_t)(e - dash - 1), hi);
}

/* Words of a list text "a, b, c or d" (and "a or b"). */
static int
nwords(const char *r)
{
	int n = 1;
	const char *p;

	for (p = r; *p != '\0'; p++)
		if (*p == ',' || strncmp(p, " or ", 4) == 0)
			n++;
	for (p = r; (p = strstr(p, ", or ")) != NULL; p++)
		n--;
	return n;
}

/* "host:port" or "[v6]:port", the port 1-65535. */
static int
addr_ok(const char *s)
{
	const char *colon;
	char *end;
	unsigned long port;

	if (s[0] == '[') {
		colon = strstr(s, "]:");
		if (colon == NULL || colon == s + 1)
			return 0;
		colon++;
	} else {
		colon = strrchr(s, ':');
		if (colon == NULL || colon == s || memchr(s, ':', (size_t)(colon - s)) != NULL)
			return 0;
	}
	if (colon[1] < '0' || colon[1] > '9')
		return 0;
	port = strtoul(colon + 1, &end, 10);
	return *end == '\0' && port >= 1 && port <= 65535;
}

/* "LO-HI of A-Z a-z 0-9 . _ -": the length and every byte in the set. */
static int
name_ok(const struct sl_key_info *k, const char *s)
{
	int64_t lo, hi;
	const char *set, *p, *q;
	size_t len = strlen(s);
	int ok;

	fz_check(range_of(k, &lo, &hi, &set) && strncmp(set, " of ", 4) == 0, "range-text",
	    "%s: range '%s' does not read", k->path, k->range);
	if ((int64_t)len < lo || (int64_t)len > hi)
		return 0;
	for (p = s; *p != '\0'; p++) {
		ok = 0;
		for (q = set + 4; *q != '\0' && !ok; q += strcspn(q, " "),
		    q += strspn(q, " ")) {
			if (q[1] == '-' && q[2] != '\0' && q[3] != '-' &&
			    (q[3] == ' ' || q[3] == '\0'))
				ok = *p >= q[0] && *p <= q[2];
			else
				ok = *p == q[0];
		}
		if (!ok)
			return 0;
	}
	return 1;
}

static void
check_url(const char *path, const char *url)
{
	size_t l;

	fz_check(url != NULL, "upstream-url", "%s: no url", path);
	fz_check(strncmp(url, "http://", 7) == 0 || strncmp(url, "https://", 8) == 0,
	    "upstream-url", "%s '%s'", path, url);
	fz_check(strpbrk(url, "?# \t\r\n") == NULL, "upstream-url", "%s '%s'", path, url);
	l = strlen(url);
	fz_check(l > 0 && url[l - 1] != '/', "upstream-url", "trailing '/' in %s '%s'", path,
	    url);
}

static int
blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static void
check_keys(const struct sl_config *cfg, size_t t)
{
	const struct sl_tenant_conf *tc = &cfg->tenants[t];
	size_t i, j, u;

	fz_check(tc->nkeys >= 1 && tc->keys != NULL, "tenant-keys", "tenant '%s' has no key",
	    tc->name);
	for (i = 0; i < tc->nkeys; i++) {
		const char *k = tc->keys[i];

		fz_check(k != NULL && k[0] != '\0', "tenant-keys", "empty key in '%s'", tc->name);
		for (j = 0; k[j] != '\0'; j++)
			fz_check(!blank(k[j]), "tenant-keys", "blank in a key of '%s'", tc->name);
		/* A key names exactly one tenant. */
		for (u = 0; u <= t; u++)
			for (j = 0; j < (u == t ? i : cfg->tenants[u].nkeys); j++)
				fz_check(strcmp(cfg->tenants[u].keys[j], k) != 0, "tenant-keys",
				    "key shared by '%s' and '%s'", cfg->tenants[u].name,
				    tc->name);
	}
}

/* Row k, whose value is w's, for object a (and replica b). */
static void
check_one(const struct sl_config *cfg, const struct sl_key_info *k, const struct where *w,
    size_t a, size_t b)
{
	const struct sl_upstream_conf *up = w->scope == UPSTREAM || w->scope == REPLICA ?
	    &cfg->upstreams[a] : NULL;
	const char *s = w->str != NULL ? w->str(cfg, a, b) : NULL;
	int64_t v = w->num != NULL ? w->num(cfg, a, b) : 0, lo, hi;

	switch (w->when) {
	case IF_CLUSTER:
		if (!cfg->cluster.enabled)
			return;
		break;
	case IF_SENTINELS:
		if (!cfg->cluster.enabled || cfg->cluster.nsentinels == 0)
			return;
		break;
	case IF_URL:
		if (up->url == NULL)
			return;
		break;
	case IF_HEALTH:
		if (!up->health.enabled)
			return;
		break;
	case IF_LOADM:
		if (!up->load_metrics.enabled)
			return;
		break;
	case IF_TLS:
		if (!cfg->tls.enabled)
			return;
		break;
	case ALWAYS:
		break;
	}
	switch (w->kind) {
	case K_NUM:
		fz_check(range_of(k, &lo, &hi, NULL), "range-text", "%s: range '%s' does not read",
		    k->path, k->range);
		if (k->type == SL_KEY_WORKERS && v == SL_WORKERS_AUTO)
			break;
		fz_check(v >= lo && v <= hi, "range", "%s = %" PRId64 " outside %s (%" PRId64
		    "-%" PRId64 ")", k->path, v, k->range, lo, hi);
		break;
	case K_ONE_OF:
		fz_check(k->range != NULL, "range-text", "%s: no range", k->path);
		fz_check(v >= 0 && v < nwords(k->range), "range", "%s = %" PRId64 ", not one of "
		    "%s", k->path, v, k->range);
		break;
	case K_BITS:
		fz_check(k->range != NULL, "range-text", "%s: no range", k->path);
		fz_check(v >= 0 && v < (1 << nwords(k->range)), "range", "%s = %#" PRIx64
		    ", not a set of %s", k->path, (uint64_t)v, k->range);
		break;
	case K_AT_LEAST_ONE:
		fz_check(v >= 1, "range", "%s: %" PRId64 ", not %s", k->path, v, k->range);
		break;
	case K_MAPPING:
		if (w->num != NULL)   /* its "present" flag */
			fz_check(v == 0 || v == 1, "range", "%s: present = %" PRId64, k->path, v);
		break;
	case K_ADDR:
		if (s != NULL || k->def != NULL || strcmp(k->path, "listen") == 0)
			fz_check(s != NULL && addr_ok(s), "addr", "%s '%s' is not %s", k->path,
			    s ? s : "(null)", k->range);
		break;
	case K_URL:
		check_url(k->path, s);
		break;
	case K_PATH:
		fz_check(s != NULL && s[0] == '/', "path", "%s '%s' is not %s", k->path,
		    s ? s : "(null)", k->range);
		break;
	case K_NAME:
		fz_check(s != NULL && name_ok(k, s), "name", "%s '%s' is not %s", k->path,
		    s ? s : "(null)", k->range);
		break;
	case K_REDIS:
		if (s == NULL && cfg->cluster.nsentinels > 0)
			break;   /* the sentinels find the master */
		fz_check(s != NULL && ((strncmp(s, "unix:/", 6) == 0) || addr_ok(s)), "redis",
		    "%s '%s' is not %s", k->path, s ? s : "(null)", k->range);
		break;
	case K_SENTINELS: {
		size_t i;

		fz_check((v == 0) != (cfg->cluster.redis == NULL), "sentinels",
		    "%s: %" PRId64 " sentinel(s) with redis %s", k->path, v,
		    cfg->cluster.redis ? cfg->cluster.redis : "(null)");
		fz_check(v >= 0 && v <= 16, "range", "%s: %" PRId64 " entries", k->path, v);
		for (i = 0; i < cfg->cluster.nsentinels; i++)
			fz_check(addr_ok(cfg->cluster.sentinels[i]), "sentinels",
			    "%s '%s' is not %s", k->path, cfg->cluster.sentinels[i], k->range);
		break;
	}
	case K_LOGDEST:
		/* off is NULL; else stderr or a path. */
		fz_check(s == NULL || (s[0] != '\0' && strcmp(s, "off") != 0), "logdest",
		    "%s '%s'", k->path, s);
		break;
	case K_KEYS:
		check_keys(cfg, a);
		break;
	case K_UPSTREAM_REF: {
		const struct sl_tenant_conf *tc = &cfg->tenants[a];

		if (!tc->has_upstream) {
			/* Only a models: section lets a tenant go without one. */
			fz_check(s == NULL && cfg->nmodels > 0, "tenant-upstream",
			    "tenant '%s' has no upstream among %zu, %zu model(s)", tc->name,
			    cfg->nupstreams, cfg->nmodels);
			break;
		}
		fz_check(tc->upstream_idx < cfg->nupstreams, "tenant-upstream",
		    "tenant '%s': upstream index %zu of %zu", tc->name, tc->upstream_idx,
		    cfg->nupstreams);
		if (s != NULL)
			fz_check(strcmp(s, cfg->upstreams[tc->upstream_idx].name) == 0,
			    "tenant-upstream", "tenant '%s' names '%s' but uses '%s'", tc->name,
			    s, cfg->upstreams[tc->upstream_idx].name);
		else
			fz_check(cfg->nupstreams == 1, "tenant-upstream",
			    "tenant '%s' without upstream among %zu", tc->name, cfg->nupstreams);
		break;
	}
	case K_NO_CRLF:
		fz_check(s == NULL || strpbrk(s, "\r\n") == NULL, "upstream-key",
		    "CR or LF in %s", k->path);
		break;
	case K_ANY:
		break;
	case K_TLS_FILE:
		fz_check(s != NULL, "tls-file", "tls: without %s", k->path);
		break;
	case K_ALIASES: {
		const struct sl_model_conf *mc = &cfg->models[a];
		size_t i;

		for (i = 0; i < mc->naliases; i++)
			fz_check(sl_config_model_find(cfg, mc->aliases[i],
			    strlen(mc->aliases[i])) == (int)a, "model-alias",
			    "model '%s': alias '%s' finds another model", mc->name,
			    mc->aliases[i]);
		fz_check(sl_config_model_find(cfg, mc->name, strlen(mc->name)) == (int)a,
		    "model-alias", "model '%s' not found by its name", mc->name);
		break;
	}
	case K_FALLBACK: {
		const struct sl_model_conf *mc = &cfg->models[a];
		size_t i;

		for (i = 0; i < mc->nfallback; i++)
			fz_check(mc->fallback[i] < cfg->nmodels && mc->fallback[i] != a,
			    "model-fallback", "model '%s': fallback #%zu is index %zu of %zu",
			    mc->name, i, mc->fallback[i], cfg->nmodels);
		break;
	}
	case K_TARGET_UPSTREAM: {
		const struct sl_model_target *t = &cfg->models[a].targets[b];

		fz_check(t->upstream_idx < cfg->nupstreams && s != NULL &&
		    strcmp(s, cfg->upstreams[t->upstream_idx].name) == 0, "model-target",
		    "model '%s': target #%zu names '%s'", cfg->models[a].name, b,
		    s ? s : "(null)");
		break;
	}
	case K_TENANT_MODELS:
		if (cfg->tenants[a].allowed != NULL)
			fz_check(cfg->nmodels > 0, "tenant-models",
			    "tenant '%s' has a model list without models", cfg->tenants[a].name);
		break;
	}
}

/* Every row of the key table, for every object it applies to. */
static void
check_rows(const struct sl_config *cfg)
{
	static const struct where *row_where[256];
	static int ready;
	const struct sl_key_info *keys = sl_config_keys(), *k;
	const struct where *w;
	size_t n, a, b;

	if (!ready) {
		for (n = 0, k = keys; k->path != NULL; k++, n++) {
			fz_check(n < 256, "unchecked-key", "more than 256 key rows");
			for (w = wheres; w->path != NULL && strcmp(w->path, k->path) != 0; w++)
				;
			fz_check(w->path != NULL, "unchecked-key", "key row '%s' has no check in "
			    "fuzz_config.c's wheres[]: say where its value lives", k->path);
			row_where[n] = w;
		}
		ready = 1;
	}
	for (n = 0, k = keys; k->path != NULL; k++, n++) {
		w = row_where[n];
		switch (w->scope) {
		case TOP:
			check_one(cfg, k, w, 0, 0);
			break;
		case UPSTREAM:
			for (a = 0; a < cfg->nupstreams; a++)
				check_one(cfg, k, w, a, 0);
			break;
		case REPLICA:
			for (a = 0; a < cfg->nupstreams; a++)
				for (b = 0; b < cfg->upstreams[a].nreplicas; b++)
					check_one(cfg, k, w, a, b);
			break;
		case TENANT:
			for (a = 0; a < cfg->ntenants; a++)
				check_one(cfg, k, w, a, 0);
			break;
		case MODEL:
			for (a = 0; a < cfg->nmodels; a++)
				check_one(cfg, k, w, a, 0);
			break;
		case TARGET:
			for (a = 0; a < cfg->nmodels; a++)
				for (b = 0; b < cfg->models[a].ntargets; b++)
					check_one(cfg, k, w, a, b);
			break;
		}
	}
}

static void
check_config(const struct sl_config *cfg)
{
	size_t i, j, t, u;

	fz_check(cfg->file != NULL && strcmp(cfg->file, NAME) == 0, "file", "file name lost");
	fz_check(cfg->nupstreams >= 1 && cfg->upstreams != NULL, "upstreams", "no upstream");
	fz_check(cfg->ntenants >= 1 && cfg->tenants != NULL, "tenants", "no tenant");
	check_rows(cfg);

	/* Cross-references the rows' help states. */
	if (cfg->cluster.enabled)
		fz_check(cfg->cluster.heartbeat_ms <= cfg->cluster.lease_ttl_ms / 3, "cross",
		    "cluster.heartbeat %" PRIu64 " ms > lease_ttl %" PRIu64 " ms / 3",
		    cfg->cluster.heartbeat_ms, cfg->cluster.lease_ttl_ms);
	for (u = 0; u < cfg->nupstreams; u++) {
		const struct sl_upstream_conf *up = &cfg->upstreams[u];

		fz_check(up->name != NULL, "upstreams", "upstream #%zu without name", u);
		fz_check(up->nreplicas >= 1 && up->replicas != NULL, "upstreams",
		    "upstream '%s' without replicas", up->name);
		if (up->url != NULL)
			fz_check(up->nreplicas == 1 && strcmp(up->replicas[0].url, up->url) == 0,
			    "upstreams", "upstream '%s': url and replicas[0] differ", up->name);
		for (i = 0; i < up->nreplicas; i++)
			for (j = 0; j < i; j++)
				fz_check(strcmp(up->replicas[i].url, up->replicas[j].url) != 0,
				    "upstreams", "upstream '%s': replica url '%s' twice", up->name,
				    up->replicas[i].url);
		if (up->health.enabled)
			fz_check(up->health.timeout_ms < up->health.interval_ms, "cross",
			    "upstream '%s': health.timeout %" PRIu64 " ms not less than the "
			    "interval %" PRIu64 " ms", up->name, up->health.timeout_ms,
			    up->health.interval_ms);
		for (j = 0; j < u; j++)
			fz_check(strcmp(cfg->upstreams[j].name, up->name) != 0, "upstreams",
			    "two upstreams named '%s'", up->name);
	}
	for (t = 0; t < cfg->ntenants; t++) {
		const struct sl_tenant_conf *tc = &cfg->tenants[t];

		fz_check(tc->name != NULL, "tenants", "tenant #%zu without a name", t);
		fz_check(sl_config_tenant_index(cfg, tc->name) == (int)t, "tenants",
		    "tenant '%s' is not found at its own index", tc->name);
		if (!cfg->usage.enabled)
			fz_check(tc->tokens_per_minute == 0, "cross", "tenant '%s': tokens_per_minute "
			    "%d with usage.enabled false", tc->name, (int)tc->tokens_per_minute);
	}
}

/*
 * 1 if a scalar of the input holds a NUL ("\0", "\x00" or "\u0000" in a
 * double-quoted string). Every scalar of an accepted config is a key or a
 * value; as C strings such a value would be cut short ("sk-\0long-secret"
 * would become the key "sk-"), so the loader must refuse it.
 */
static int
has_nul_scalar(const uint8_t *data, size_t size)
{
	yaml_parser_t p;
	yaml_event_t ev;
	int found = 0, done = 0;

	if (!yaml_parser_initialize(&p))
		abort();
	yaml_parser_set_input_string(&p, data, size);
	while (!done && !found) {
		if (!yaml_parser_parse(&p, &ev))
			break;
		if (ev.type == YAML_SCALAR_EVENT &&
		    memchr(ev.data.scalar.value, '\0', ev.data.scalar.length) != NULL)
			found = 1;
		done = ev.type == YAML_STREAM_END_EVENT;
		yaml_event_delete(&ev);
	}
	yaml_parser_delete(&p);
	return found;
}

/* "NAME:LINE:COL: message"; returns LINE and COL through the pointers. */
static void
check_message(const char *msg, size_t len, unsigned long *line, unsigned long *col)
{
	size_t nl = strlen(NAME);
	const char *p;
	char *end;

	fz_check(msg != NULL, "message", "NULL message");
	fz_check(strncmp(msg, NAME ":", nl + 1) == 0, "message", "'%s' does not name the file",
	    msg);
	p = msg + nl + 1;
	fz_check(*p >= '1' && *p <= '9', "message", "'%s': no line", msg);
	*line = strtoul(p, &end, 10);
	fz_check(*end == ':' && end[1] >= '1' && end[1] <= '9', "message", "'%s': no column",
	    msg);
	*col = strtoul(end + 1, &end, 10);
	fz_check(end[0] == ':' && end[1] == ' ' && end[2] != '\0', "message",
	    "'%s': no ': message'", msg);
	/* One problem, one line: a value quoted in a message must not break it. */
	fz_check(strpbrk(msg, "\r\n") == NULL, "message-oneline",
	    "message spans lines: '%s'", msg);
	/* Marks point into the input (or just past its end). */
	fz_check(*line <= len + 1 && *col <= len + 1, "message",
	    "'%s' points past %zu bytes", msg, len);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sl_config *cfg = (struct sl_config *)&cfg;   /* must be reset */
	struct sl_errors errs = { 0 };
	unsigned long line, col, pline = 0, pcol = 0;
	char *copy;
	size_t i;
	int rc;

	/* Exactly the input's size, so ASan sees any read past its end. */
	if ((copy = malloc(size ? size : 1)) == NULL)
		abort();
	memcpy(copy, data, size);
	rc = sl_config_load_buffer(NAME, copy, size, &cfg, &errs);
	if (rc == 0) {
		fz_check(cfg != NULL && errs.n == 0, "result", "0 with %zu errors or no config",
		    errs.n);
		check_config(cfg);
		sl_config_free(cfg);
		fz_check(!has_nul_scalar(data, size), "nul-scalar",
		    "a value holding NUL was accepted (cut at the NUL)");
	} else {
		fz_check(rc == -1 && cfg == NULL, "result", "rc %d, config %p", rc, (void *)cfg);
		fz_check(errs.n >= 1 && errs.msg != NULL, "result", "failure without a message");
		for (i = 0; i < errs.n; i++) {
			check_message(errs.msg[i], size, &line, &col);
			fz_check(line > pline || (line == pline && col >= pcol), "message-order",
			    "'%s' after line %lu col %lu", errs.msg[i], pline, pcol);
			pline = line;
			pcol = col;
		}
	}
	sl_errors_free(&errs);
	free(copy);
	return 0;
}
