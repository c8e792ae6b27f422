/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Inside the configuration parser: what its files share, and nothing the
 * rest of sluice may use (that is sl_config.h).
 *
 * The layers, from the bottom up; each calls only those below it:
 *
 *   config_values.c     a scalar's text -> a number or a verdict; sees no
 *                       YAML and reports nothing.
 *   config_errors.c     the error reporter, cfg_err_at: formats and keeps
 *                       one message, calls nothing of the parser.
 *   config_yaml.c       walking the document: nodes, scalars, mappings
 *                       pair by pair, lists; string sets for duplicates.
 *                       Knows no key of the configuration.
 *   config_keys.c       the key table and the typed setter it drives
 *                       (cfg_find_key, cfg_set_value).
 *   config_upstreams.c  upstreams: and their replicas.
 *   config_models.c     models: their names, aliases, targets, fallbacks.
 *   config_tenants.c    tenants: their keys, limits and allowed models.
 *   config.c (top)      the top level, the cluster: and tls: checks, and
 *                       the load, which calls each section through its
 *                       cfg_parse_* entry point, in the order above.
 *
 * The three sections do not call each other, save through sl_config.h's
 * lookups (a tenant's models: through sl_config_model_find).
 */
#ifndef SL_CONFIG_INT_H
#define SL_CONFIG_INT_H

#include <stddef.h>
#include <stdint.h>
#include <yaml.h>

#include "sl_config.h"

#define KIB 1024ULL
#define MIB (1024ULL * KIB)
#define GIB (1024ULL * MIB)
#define SEC 1000ULL
#define MIN (60ULL * SEC)
#define HOUR (60ULL * MIN)

/* ---- value parsers (config_values.c) ------------------------------------
 * Pure functions of their arguments. The parsers return 0 and set *out, or
 * -1 leaving *out alone; the cfg_valid_* checks return 1 if s is well
 * formed, else 0.
 */

/* Decimal, optional sign, nothing around it; the whole int64_t range. */
int cfg_parse_int(const char *s, int64_t *out);
/* "1.5" -> 150: at most 2 decimals, no sign, at most 10^9 hundredths. */
int cfg_parse_hundredths(const char *s, int64_t *out);
/* host:port or [v6]:port, port 1-65535; digits-and-dots hosts are IPv4. */
int cfg_valid_addr(const char *s);
/* A URL authority's optional :PORT (n bytes of it): 0 if valid, else -1. */
int cfg_check_url_port(const char *a, size_t n);
/* A Redis address with no host name to resolve: IP:port or unix:/path. */
int cfg_valid_redis_addr(const char *s);
/* 1 if s holds a control character (below 0x20, or DEL). */
int cfg_has_control(const char *s);
/* A cluster node name: 1-64 of A-Z a-z 0-9 . _ - */
int cfg_valid_node_name(const char *s);
/* A client API key: non-empty, no space, control character or DEL. */
int cfg_valid_api_key(const char *s);
/* A probe path for a request line: '/' first, no space or control. */
int cfg_valid_probe_path(const char *s);

/* ---- the parse and its error reporter (config.c) -----------------------
 * One parse of one file: what every section reads and writes. Errors go to
 * cfg_err_at, never straight to errs, so that each is "FILE:LINE:COL: ..."
 * and an aliased value is reported once (while quiet is non-zero).
 */

/*
 * A set of borrowed strings, each with two caller indices, for duplicate
 * detection in O(n): sized once by cfg_strset_init for at most n adds.
 */
struct strset_slot {
	uint64_t hash;
	const char *s;          /* NULL: empty */
	size_t a, b;
};

struct strset {
	struct strset_slot *slots;
	size_t mask;
};

struct ctx {
	const char *name;
	const unsigned char *data; /* the text, for positions libyaml omits */
	size_t len;
	int check_files;           /* open what the config names (access_log) */
	yaml_mark_t **key_marks_tenant;   /* per tenant: where each key was */
	yaml_document_t *doc;
	struct sl_errors *errs;
	struct sl_config *cfg;
	unsigned char *seen;       /* per node: visited (alias detection) */
	struct strset model_set;   /* models' names and aliases, while parsed */
	int models_section;        /* the file has a models: key */
	yaml_node_t **fallback_nodes;   /* per model: its fallback: list */
	int quiet;                 /* inside an aliased value: errors muted */
	size_t nnodes;
};

/* A message (malloc'd, taken) for errs; NULL is ignored. */
void cfg_err_add(struct sl_errors *errs, char *msg);
/* The one error reporter: "NAME:LINE:COL: message" at m (1:1 if NULL). */
void cfg_err_at(struct ctx *, const yaml_mark_t *m, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- YAML walking (config_yaml.c) ---------------------------------------
 * Reading nodes marks them seen: a node reached twice is an alias. The
 * helpers that can find a problem (want_scalar, require_mapping,
 * each_pair, list_of_maps, strdup) report it at the node; the others
 * report nothing.
 */

typedef void (*cfg_pair_fn)(struct ctx *, yaml_node_t *key, yaml_node_t *val,
    void *arg);

/* Node id of the document, marked seen; NULL if there is none. */
yaml_node_t *cfg_node(struct ctx *, int id);
/* 1 if node id was read before: it is an alias (reported by the prescan). */
int cfg_seen_before(const struct ctx *, int id);
const char *cfg_scalar(yaml_node_t *);
int cfg_is_null(yaml_node_t *);
/* "a mapping", "a list", "null" or "a scalar", for messages. */
const char *cfg_type_name(yaml_node_t *);
/* A non-null scalar without NULs, or NULL after reporting it at n. */
const char *cfg_want_scalar(struct ctx *, yaml_node_t *n, const char *key);
/* strdup, reporting "out of memory" when it fails. */
char *cfg_strdup(struct ctx *, const char *s);
/*
 * fn(c, key, value, arg) for each pair of map in order, after reporting
 * (and skipping) non-scalar and duplicate keys; muted under an alias.
 */
void cfg_each_pair(struct ctx *, yaml_node_t *map, cfg_pair_fn fn, void *arg);
/* *ok = v is a mapping; if not, reported at v. */
void cfg_require_mapping(struct ctx *, yaml_node_t *v, const char *path,
    int *ok);
/* The value of key in map, not marked seen; NULL if absent. */
yaml_node_t *cfg_find_child(struct ctx *, yaml_node_t *map, const char *key);
size_t cfg_map_len(yaml_node_t *map);
/*
 * A list of 1..max mappings (replicas, targets): its items in *items and
 * how many to read; 0 after reporting a value that is not a list or is
 * empty. Entries past max are reported where the first of them is.
 */
size_t cfg_list_of_maps(struct ctx *, yaml_node_t *v, const char *path,
    const char *what, size_t max, yaml_node_item_t **items);

/* Room for n strings: 0, or -1 on ENOMEM. Free with cfg_strset_free. */
int cfg_strset_init(struct strset *, size_t n);
void cfg_strset_free(struct strset *);
/* Add s with a, b: NULL if new, else the equal entry's slot (s not added). */
const struct strset_slot *cfg_strset_add(struct strset *, const char *s,
    size_t a, size_t b);

/* ---- the key table (config.c) -------------------------------------------
 * keys[] says each key's type, range and default; per-upstream, per-model
 * and per-tenant keys are found by their pattern ("upstreams.*.retries").
 */

struct key_row {
	struct sl_key_info info;
	uint64_t min, max;      /* in the key's unit (bytes, ms, or integers) */
	int required;
	size_t off;             /* offsetof in struct sl_config, or SIZE_MAX */
};

#define OFF(f) offsetof(struct sl_config, f)
#define NOOFF SIZE_MAX

/* The key table, ended by a row whose path is NULL; at most CFG_KEYS_MAX. */
#define CFG_KEYS_MAX 256
extern const struct key_row cfg_keys[];

/* The row of cfg_keys[] named path ("upstreams.*.retries"), or NULL. */
const struct key_row *cfg_find_key(const char *path);
/*
 * Parse scalar v as row's type into dst (whose C type the row says),
 * range-checked; on error report at v and leave dst as it was.
 */
void cfg_set_value(struct ctx *, const struct key_row *row, const char *path,
    yaml_node_t *v, void *dst);

/* ---- the sections (config_upstreams.c, config_models.c, ...) -----------
 * Each entry point reads one top-level mapping n, once the top level is
 * read, into c->cfg, reporting every problem. Called by load in this
 * order: upstreams, models (targets name upstreams), tenants (which name
 * either).
 */

/* Per-entry state of an upstream or a tenant while its keys are read. */
struct named_arg {
	size_t idx;
	unsigned char present[8];
	yaml_node_t *upstream_node;
};

void cfg_parse_upstreams(struct ctx *, yaml_node_t *n);
/* Also builds cfg->model_names, which sl_config_model_find reads. */
void cfg_parse_models(struct ctx *, yaml_node_t *n);
void cfg_parse_tenants(struct ctx *, yaml_node_t *n);

#endif
