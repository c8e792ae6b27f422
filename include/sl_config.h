/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_config: the YAML configuration, parsed, validated and owned as one
 * immutable value. Parse, validate, then swap: a caller never sees a half
 * built config.
 */
#ifndef SL_CONFIG_H
#define SL_CONFIG_H

#include <limits.h>          /* PATH_MAX, for permission warnings */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "sl_tls.h"

#define SL_WORKERS_AUTO 0          /* workers: auto (resolved by the master) */
#define SL_MAX_WORKERS 64
#define SL_MAX_TENANTS 1000000      /* limits.max_tenants at most */
#define SL_MAX_UPSTREAMS_LIMIT 10000  /* limits.max_upstreams at most */
#define SL_MAX_QUEUED_UPSTREAMS 64    /* upstreams with `queue:` */
#define SL_REPLICAS_MIN_ROOM 4096     /* replicas in all, at least */

enum sl_log_level { SL_LOG_ERROR = 0, SL_LOG_WARN, SL_LOG_INFO, SL_LOG_DEBUG };

enum sl_balance {
	SL_BALANCE_LEAST_LOADED = 0,   /* default */
	SL_BALANCE_ROUND_ROBIN,
	SL_BALANCE_RANDOM,
	SL_BALANCE_PREFIX_AFFINITY     /* longest cached prompt prefix */
};

/* upstreams.*.queue.fairness */
enum sl_fairness {
	SL_FAIRNESS_TOKENS = 0,        /* default: weighted least-served first */
	SL_FAIRNESS_FIFO
};

/* upstreams.*.retry_on, a bit set. */
#define SL_RETRY_CONNECT 0x1u      /* no connection could be made */
#define SL_RETRY_BUSY    0x2u      /* a 429, 502 or 503 response head */
#define SL_RETRY_EMPTY   0x4u      /* closed after the request, no response byte */

#define SL_MAX_REPLICAS 64         /* per upstream */

struct sl_replica_conf {
	char *url;          /* base URL without trailing '/'; the path is appended */
	int32_t weight;     /* 1..100, default 1 */
	int32_t max_streams;   /* streams in flight to it, all workers; 0: no cap */
};

/*
 * An upstream is a pool of replicas. `url:` alone is a pool of one: then
 * url is set and replicas[0].url equals it (its own copy: each string is
 * freed on its own); with `replicas:`, url is NULL. nreplicas >= 1 in a
 * valid config, and no two replicas of an upstream share a URL.
 */
struct sl_upstream_conf {
	char *name;
	char *url;          /* `url:` form only, else NULL */
	char *api_key;      /* NULL: no Authorization header upstream */
	struct sl_replica_conf *replicas;
	size_t nreplicas;
	enum sl_balance balance;
	int32_t retries;    /* other replicas tried, before any response byte */
	unsigned retry_on;  /* SL_RETRY_*; default CONNECT | BUSY */
	uint64_t busy_max_ms;   /* a busy mark lasts at most this; default 30s */
	struct {
		int enabled;            /* a `health:` mapping is present */
		char *path;             /* default "/health" */
		uint64_t interval_ms;   /* default 2s */
		uint64_t timeout_ms;    /* default 1s */
		int32_t fall;           /* consecutive failures -> down, default 3 */
		int32_t rise;           /* consecutive successes -> up, default 2 */
	} health;
	struct {
		int32_t block;          /* prompt bytes per hashed block, default 64 */
		int32_t max_imbalance;  /* in hundredths: 150 = 1.5 (default) */
	} affinity;
	struct {
		int32_t max;            /* stored response ids kept; 0: off */
		uint64_t ttl_ms;        /* unused this long: forgotten; 1h */
	} response_affinity;
	struct {
		int enabled;            /* a `load_metrics:` mapping is present */
		char *path;             /* default "/metrics" */
		uint64_t interval_ms;   /* default 250ms, >= 50ms */
	} load_metrics;
	struct {
		int enabled;            /* a `queue:` mapping is present */
		int32_t max;            /* waiters, all workers; default 1000 */
		uint64_t timeout_ms;    /* longest wait; default 30s */
		int32_t fairness;       /* enum sl_fairness */
	} queue;
	int inject_priority;    /* add "priority": -P to JSON bodies */
	struct {
		int32_t failures;       /* consecutive failures -> ejected; 0: off */
		uint64_t duration_ms;   /* first ejection; doubled, capped at 5 min */
		int32_t max_percent;    /* never eject more of the pool than this */
	} eject;
};

/* cluster.on_redis_down */
enum sl_redis_down {
	SL_DOWN_LOCAL_SHARE = 0,   /* default: ceil(max_streams / live nodes) */
	SL_DOWN_CLOSED,            /* 503 cluster_unavailable */
	SL_DOWN_LOCAL_FULL         /* max_streams on this node alone */
};

/* `cluster:`: one per-tenant limit across nodes, through Redis leases. */
struct sl_cluster_conf {
	int enabled;               /* the mapping is present */
	char *redis;               /* "IP:port", "[v6]:port" or "unix:/path";
	                              NULL with sentinels */
	char **sentinels;          /* "IP:port" each, asked in order; or NULL */
	size_t nsentinels;         /* 0: cluster.redis is the master */
	char *master_name;         /* the name the sentinels monitor */
	char *sentinel_password;   /* NULL or "": no AUTH to the sentinels */
	char *password;            /* NULL or "": no AUTH */
	char *node;                /* default: the host name */
	uint64_t lease_ttl_ms;     /* default 10s */
	uint64_t heartbeat_ms;     /* default 2s; <= lease_ttl / 3 */
	uint64_t timeout_ms;       /* default 100ms */
	int32_t on_redis_down;     /* enum sl_redis_down */
};

/*
 * `models:`: the name a client sends in "model" -> the upstream that
 * serves it. Without the section, models is NULL and nmodels 0 (requests
 * go to their tenant's upstream, the body unread).
 */
#define SL_MODEL_NAME_MAX 256      /* bytes of a model name or alias */
#define SL_MAX_TARGETS 64          /* per model */
#define SL_MAX_MODELS 100000       /* limits.max_models at most */

struct sl_model_target {
	char *upstream;        /* upstream name, as written */
	size_t upstream_idx;   /* index into sl_config.upstreams */
	char *model;           /* sent upstream; default: the model's name */
	int32_t weight;        /* 1..1000, default 1 */
};

struct sl_model_conf {
	char *name;
	char **aliases;
	size_t naliases;
	struct sl_model_target *targets;   /* ntargets >= 1 in a valid config */
	size_t ntargets;
	size_t *fallback;      /* models tried, in order, when no target can
	                        * take a request (indices; no cycle) */
	size_t nfallback;
};

/* A slot of the name -> model table (names and aliases). */
struct sl_model_name {
	const char *name;      /* borrowed from the model; NULL: empty slot */
	size_t len;
	size_t model;          /* index into sl_config.models */
};

struct sl_tenant_conf {
	char *name;
	char **keys;
	size_t nkeys;
	int32_t max_streams;
	int32_t retry_after;   /* seconds */
	int32_t tokens_per_minute;   /* budget over the last 60 s; 0: none */
	int32_t weight;        /* share of a saturated pool, 1..1000, default 1 */
	int32_t priority;      /* queue band, -100..100, default 0; < 0: shed */
	char *upstream;        /* upstream name, as written; NULL: none */
	size_t upstream_idx;   /* index into sl_config.upstreams */
	int has_upstream;      /* requests naming no model have an upstream */
	/*
	 * `models:` of the tenant: the indices into sl_config.models it may
	 * use, ascending, nallowed of them (4 bytes each, not a byte per
	 * model of the file). NULL: every model (sl_tenant_allows).
	 */
	uint32_t *allowed;
	size_t nallowed;
};

struct sl_config {
	char *file;            /* path the config was read from */
	char *listen;          /* "host:port" or "[v6]:port" */
	char *admin_listen;    /* NULL: no admin listener */
	int workers;           /* SL_WORKERS_AUTO or 1..SL_MAX_WORKERS */
	uint64_t stream_buffer;      /* bytes */
	uint64_t drain_timeout_ms;
	char *access_log;      /* NULL: off; "stderr" or a path */
	enum sl_log_level log_level;

	struct {
		uint64_t upstream_connect_ms;
		uint64_t upstream_first_byte_ms;
		uint64_t upstream_idle_ms;
		uint64_t client_header_ms;
		uint64_t client_body_ms;
		uint64_t client_stall_ms;
		uint64_t keepalive_ms;
	} timeouts;

	struct {
		uint64_t max_header_bytes;
		uint64_t max_body_bytes;
		uint64_t max_connections;   /* per worker */
		uint64_t upstream_rcvbuf;   /* SO_RCVBUF upstream; 0: kernel's */
		uint64_t client_sndbuf;     /* SO_SNDBUF to clients; 0: kernel's */
		uint64_t h2_max_streams;    /* per HTTP/2 connection */
		uint64_t max_tenants;       /* room at start (sl_shm) */
		uint64_t max_models;        /* room at start (sl_shm) */
		uint64_t max_upstreams;     /* room at start (sl_shm) */
	} limits;
	struct sl_tls_conf tls;

	struct sl_cluster_conf cluster;
	struct {
		int enabled;   /* read usage at all */
		int inject;    /* ask streamed requests for the usage chunk */
	} usage;

	struct sl_upstream_conf *upstreams;
	size_t nupstreams;
	struct sl_tenant_conf *tenants;
	size_t ntenants;
	struct sl_model_conf *models;   /* NULL: no `models:` section */
	size_t nmodels;
	struct sl_model_name *model_names;   /* open addressing, built once */
	size_t model_mask;                   /* slots - 1 */
	int64_t loaded_at;     /* time(NULL) when loaded: /v1/models' created */
};

/*
 * Problems found while loading, each formatted "FILE:LINE:COL: message"
 * (LINE and COL 1-based). Every problem is collected, not only the first.
 */
struct sl_errors {
	char **msg;
	size_t n;
};

void sl_errors_free(struct sl_errors *);
void sl_errors_print(const struct sl_errors *, FILE *);

/* Deepest nesting of lists and mappings a file may have (the root is 1). */
#define SL_CONFIG_MAX_DEPTH 32

/*
 * Load and validate the file at path, which must be a regular file. On
 * success returns 0 and *out owns a new config (free with
 * sl_config_free). On failure returns -1, *out is NULL and errs holds at
 * least one message (caller frees with sl_errors_free). errs must be
 * zeroed by the caller. Besides what sl_config_load_buffer checks, it
 * opens (creating it if need be) the access_log file, as the workers will.
 * Used by `sluice -t`, at start and on every reload.
 */
int sl_config_load_file(const char *path, struct sl_config **out,
    struct sl_errors *errs);
/*
 * sl_config_load_file on a thread of its own, so that glibc gives the
 * parse its own malloc arena: the configuration and the holes its parse
 * leaves sit apart from the main thread's heap, and a worker forked
 * later allocates in the main arena without copying a page of the
 * inherited configuration (else about 11 bytes a tenant a worker:
 * bench/RESULTS.md).
 */
int sl_config_load_file_apart(const char *path, struct sl_config **out,
    struct sl_errors *errs);

/*
 * Same, from memory; name is used in messages in place of a file name.
 * Touches no file (tests and fuzzers call it).
 */
int sl_config_load_buffer(const char *name, const char *data, size_t len,
    struct sl_config **out, struct sl_errors *errs);

/*
 * The file holds API keys: if the file at path is readable by others,
 * write a one-line warning (no newline) into msg and return 1, else 0.
 * Call after a successful check or load; the caller chooses where the
 * warning goes (stderr for -t, the log for the master).
 */
int sl_config_permission_warning(const char *path, char *msg, size_t len);

void sl_config_free(struct sl_config *);

/*
 * Where a `cluster:` section leads, fixed for the master's life: its Redis
 * or sentinels and master name, passwords and node name. Whether o and n
 * lead to the same place; o's place in words for a log ("no cluster", the
 * Redis address, or "sentinels A, B (master 'NAME')"); make n's place o's
 * (n's own strings freed; a copy that runs out of memory is left NULL).
 */
int sl_cluster_same_place(const struct sl_cluster_conf *o,
    const struct sl_cluster_conf *n);
void sl_cluster_place_str(const struct sl_cluster_conf *o, char *buf, size_t len);
void sl_cluster_keep_place(struct sl_cluster_conf *n, const struct sl_cluster_conf *o);

/* Find a tenant index by name; -1 if absent. */
int sl_config_tenant_index(const struct sl_config *, const char *name);

/*
 * The model a client's name (len bytes, maybe with NUL bytes: compared
 * whole) or alias stands for, as an index into cfg->models; -1 if none.
 */
/*
 * Replicas (URLs of every upstream) a configuration may name in all: 4
 * per limits.max_upstreams, at least SL_REPLICAS_MIN_ROOM.
 */
size_t sl_config_replica_room(const struct sl_config *);
/* Replicas the configuration names in all (every upstream's). */
size_t sl_config_nreplicas(const struct sl_config *);
/* May the tenant use model m (index into sl_config.models)? */
int sl_tenant_allows(const struct sl_tenant_conf *, size_t m);
int sl_config_model_find(const struct sl_config *, const char *name,
    size_t len);

/* Name of an on_redis_down mode ("local_share", ...). */
const char *sl_redis_down_name(int mode);

/*
 * Value parsers, exposed for tests and for the command line.
 * Sizes: a non-negative integer with an optional suffix B, KiB, MiB, GiB
 * ("64KiB", "1 MiB", "512"). Durations: a non-negative number with a
 * required unit ms, s, m or h ("250ms", "1.5s", "2m"). Both return 0 and
 * set *out, or -1 on syntax error or overflow.
 */
int sl_parse_size(const char *s, uint64_t *out);
int sl_parse_duration_ms(const char *s, uint64_t *out_ms);

/*
 * The table of configuration keys: one row per key, from which the parser,
 * `sluice -t -v` style listings and the man page check are driven.
 */
enum sl_key_type {
	SL_KEY_STRING, SL_KEY_ADDR, SL_KEY_SIZE, SL_KEY_DURATION, SL_KEY_INT,
	SL_KEY_WORKERS, SL_KEY_LOGLEVEL, SL_KEY_LOGDEST, SL_KEY_MAP, SL_KEY_LIST,
	SL_KEY_LIST_OF_MAPS,   /* upstreams.*.replicas */
	SL_KEY_REDIS_DOWN,     /* cluster.on_redis_down */
	SL_KEY_BOOL,           /* true or false */
	SL_KEY_DECIMAL         /* 1.5: int32 hundredths; min/max in hundredths */
};

struct sl_key_info {
	const char *path;       /* "timeouts.client_header", "tenants.*.max_streams" */
	enum sl_key_type type;
	const char *def;        /* default as written in YAML; NULL: required or none */
	const char *range;      /* human readable range, or NULL */
	int reloadable;         /* 1: applied by SIGHUP */
	const char *help;
};

/* NULL-terminated table of every key the parser accepts. */
const struct sl_key_info *sl_config_keys(void);

#endif
