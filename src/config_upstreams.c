/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Configuration, the upstreams: section: each upstream's URL or pool of
 * replicas, its balance and retry words, and its health, eject, affinity,
 * load_metrics and queue mappings. The scalar keys are typed by their rows
 * in the key table (config.c); this file says where each value goes.
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "sl_config.h"
#include "config_int.h"

/* ---- one upstream ----------------------------------------------------- */

/*
 * Check a base URL in place: http:// or https://, a host, no user info,
 * query, fragment or space; strip its trailing slashes. 0 if valid, else the
 * problem is reported at v and -1 returned.
 */
static int
check_url(struct ctx *c, yaml_node_t *v, const char *path, char *url)
{
	const char *host;
	size_t l;

	if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) {
		cfg_err_at(c, &v->start_mark,
		    "%s: '%s' must start with http:// or https://", path, url);
		return -1;
	}
	host = strstr(url, "://") + 3;
	if (*host == '\0' || *host == '/' || *host == ':' || *host == '@') {
		cfg_err_at(c, &v->start_mark, "%s: '%s' names no host", path, url);
		return -1;
	}
	if (strpbrk(url, "?# \t\r\n") != NULL) {
		cfg_err_at(c, &v->start_mark,
		    "%s: must not contain a query, fragment or spaces", path);
		return -1;
	}
	/* The URL as written names the replica in metrics and the access log. */
	if (memchr(host, '@', strcspn(host, "/")) != NULL) {
		cfg_err_at(c, &v->start_mark, "%s: must not contain a user or password "
		    "(it would show in metrics and the access log); use api_key",
		    path);
		return -1;
	}
	if (cfg_check_url_port(host, strcspn(host, "/")) == -1) {
		cfg_err_at(c, &v->start_mark, "%s: '%s' has no valid port after its "
		    "host (1 to 65535, or none for the scheme's)", path, url);
		return -1;
	}
	l = strlen(url);
	while (l > 0 && url[l - 1] == '/')
		url[--l] = '\0';
	return 0;
}

/* Parse a URL value into *dst (the old value freed); NULL if invalid. */
static void
set_url(struct ctx *c, const struct key_row *row, const char *path,
    yaml_node_t *v, char **dst)
{
	cfg_set_value(c, row, path, v, dst);
	if (*dst != NULL && check_url(c, v, path, *dst) == -1) {
		free(*dst);
		*dst = NULL;
	}
}

/*
 * Where the scalar keys of an upstream (and of its health and eject
 * mappings) and of a replica entry go; their rows in keys[] say the type,
 * range and default. balance and retry_on have words of their own.
 */
struct field {
	const char *path;       /* a row of keys[] */
	size_t off;             /* in struct sl_upstream_conf or sl_replica_conf */
};

#define UOFF(f) offsetof(struct sl_upstream_conf, f)
#define ROFF(f) offsetof(struct sl_replica_conf, f)

static const struct field upstream_fields[] = {
	{ "upstreams.*.retries", UOFF(retries) },
	{ "upstreams.*.busy_max", UOFF(busy_max_ms) },
	{ "upstreams.*.health.path", UOFF(health.path) },
	{ "upstreams.*.health.interval", UOFF(health.interval_ms) },
	{ "upstreams.*.health.timeout", UOFF(health.timeout_ms) },
	{ "upstreams.*.health.fall", UOFF(health.fall) },
	{ "upstreams.*.health.rise", UOFF(health.rise) },
	{ "upstreams.*.affinity.block", UOFF(affinity.block) },
	{ "upstreams.*.affinity.max_imbalance", UOFF(affinity.max_imbalance) },
	{ "upstreams.*.response_affinity.max", UOFF(response_affinity.max) },
	{ "upstreams.*.response_affinity.ttl", UOFF(response_affinity.ttl_ms) },
	{ "upstreams.*.load_metrics.path", UOFF(load_metrics.path) },
	{ "upstreams.*.load_metrics.interval", UOFF(load_metrics.interval_ms) },
	{ "upstreams.*.queue.max", UOFF(queue.max) },
	{ "upstreams.*.queue.timeout", UOFF(queue.timeout_ms) },
	{ "upstreams.*.inject_priority", UOFF(inject_priority) },
	{ "upstreams.*.eject.failures", UOFF(eject.failures) },
	{ "upstreams.*.eject.duration", UOFF(eject.duration_ms) },
	{ "upstreams.*.eject.max_percent", UOFF(eject.max_percent) },
	{ NULL, 0 }
};

static const struct field replica_fields[] = {
	{ "upstreams.*.replicas[].weight", ROFF(weight) },
	{ "upstreams.*.replicas[].max_streams", ROFF(max_streams) },
	{ NULL, 0 }
};

/* Indexed by enum sl_balance. */
static const char *const balance_words[] = {
	"least_loaded", "round_robin", "random", "prefix_affinity", NULL
};

static const struct {
	const char *word;
	unsigned bit;
} retry_words[] = {
	{ "connect", SL_RETRY_CONNECT }, { "busy", SL_RETRY_BUSY },
	{ "empty", SL_RETRY_EMPTY }, { NULL, 0 }
};

/* The field of pattern ("upstreams.*.health" and key "fall"), or NULL. */
static const struct field *
find_field(const struct field *tab, const char *pattern, const char *key)
{
	size_t pl = strlen(pattern);

	if (strchr(key, '.') != NULL)
		return NULL;   /* "health.path" is not a key of an upstream */
	for (; tab->path != NULL; tab++)
		if (strncmp(tab->path, pattern, pl) == 0 &&
		    tab->path[pl] == '.' && strcmp(tab->path + pl + 1, key) == 0)
			return tab;
	return NULL;
}

/* Give every field of tab its default from keys[]; base is the struct. */
static void
fields_default(struct ctx *c, const struct field *tab, void *base)
{
	for (; tab->path != NULL; tab++) {
		const struct key_row *row = cfg_find_key(tab->path);
		void *dst = (char *)base + tab->off;
		uint64_t u;
		int64_t i;

		switch (row->info.type) {
		case SL_KEY_INT:
			*(int32_t *)dst = (int32_t)strtol(row->info.def, NULL, 10);
			break;
		case SL_KEY_DURATION:
			if (sl_parse_duration_ms(row->info.def, &u) == 0)
				*(uint64_t *)dst = u;
			break;
		case SL_KEY_STRING:
			*(char **)dst = cfg_strdup(c, row->info.def);
			break;
		case SL_KEY_DECIMAL:
			if (cfg_parse_hundredths(row->info.def, &i) == 0)
				*(int32_t *)dst = (int32_t)i;
			break;
		case SL_KEY_BOOL:
			*(int *)dst = strcmp(row->info.def, "true") == 0;
			break;
		default:
			break;
		}
	}
}

/* The defaults of an upstream, whichever of its keys are written. */
static void
upstream_defaults(struct ctx *c, struct sl_upstream_conf *u)
{
	const char *def = cfg_find_key("upstreams.*.retry_on")->info.def, *p;
	size_t i, l;

	fields_default(c, upstream_fields, u);
	for (i = 0; balance_words[i] != NULL; i++)
		if (strcmp(balance_words[i],
		    cfg_find_key("upstreams.*.balance")->info.def) == 0)
			u->balance = (enum sl_balance)i;
	/* "[connect, busy]" */
	u->retry_on = 0;
	for (p = def; *p != '\0'; p += l) {
		p += strspn(p, "[], ");
		l = strcspn(p, "[], ");
		for (i = 0; retry_words[i].word != NULL; i++)
			if (l > 0 && strlen(retry_words[i].word) == l &&
			    strncmp(retry_words[i].word, p, l) == 0)
				u->retry_on |= retry_words[i].bit;
	}
	u->health.enabled = 0;
	u->load_metrics.enabled = 0;
	u->queue.enabled = 0;
	u->queue.fairness = SL_FAIRNESS_TOKENS;
}

static void
parse_fairness(struct ctx *c, struct sl_upstream_conf *u, yaml_node_t *v,
    const char *path)
{
	const char *s = cfg_want_scalar(c, v, path);

	if (s == NULL)
		return;
	if (strcmp(s, "tokens") == 0)
		u->queue.fairness = SL_FAIRNESS_TOKENS;
	else if (strcmp(s, "fifo") == 0)
		u->queue.fairness = SL_FAIRNESS_FIFO;
	else
		cfg_err_at(c, &v->start_mark, "%s: '%s' must be one of tokens, fifo",
		    path, s);
}

/* health:, eject:, affinity:, load_metrics:, queue: and response_affinity: keys. */
struct section_arg {
	struct sl_upstream_conf *u;
	const char *section;            /* "health" or "eject" */
	yaml_node_t *interval, *timeout;   /* value nodes, when written */
};

static void
section_pair(struct ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg)
{
	struct section_arg *a = arg;
	const char *key = cfg_scalar(k);
	const struct field *f;
	char pattern[64], path[320];

	snprintf(pattern, sizeof(pattern), "upstreams.*.%s", a->section);
	snprintf(path, sizeof(path), "upstreams.%s.%s.%s", a->u->name, a->section,
	    key);
	if (strcmp(a->section, "queue") == 0 && strcmp(key, "fairness") == 0) {
		parse_fairness(c, a->u, v, path);
		return;
	}
	if ((f = find_field(upstream_fields, pattern, key)) == NULL) {
		cfg_err_at(c, &k->start_mark, "unknown key '%s' in upstreams.%s.%s",
		    key, a->u->name, a->section);
		return;
	}
	cfg_set_value(c, cfg_find_key(f->path), path, v, (char *)a->u + f->off);
	if (f->off == UOFF(health.path) && a->u->health.path != NULL &&
	    !cfg_valid_probe_path(a->u->health.path))
		cfg_err_at(c, &v->start_mark, "%s: '%s' must start with '/' and hold "
		    "no spaces or control characters", path, a->u->health.path);
	else if (f->off == UOFF(load_metrics.path) &&
	    a->u->load_metrics.path != NULL &&
	    !cfg_valid_probe_path(a->u->load_metrics.path))
		cfg_err_at(c, &v->start_mark, "%s: '%s' must start with '/' and hold "
		    "no spaces or control characters", path,
		    a->u->load_metrics.path);
	else if (f->off == UOFF(health.interval_ms))
		a->interval = v;
	else if (f->off == UOFF(health.timeout_ms))
		a->timeout = v;
}

/*
 * A probe that may outlast its interval would overlap the next one: report
 * it at the timeout if written, else at the interval that is too short.
 */
static void
check_probe_times(struct ctx *c, struct section_arg *a)
{
	const struct sl_upstream_conf *u = a->u;
	const char *tv, *iv;

	if (u->health.timeout_ms < u->health.interval_ms)
		return;
	tv = a->timeout && a->timeout->type == YAML_SCALAR_NODE ?
	    cfg_scalar(a->timeout) : cfg_find_key("upstreams.*.health.timeout")->info.def;
	iv = a->interval && a->interval->type == YAML_SCALAR_NODE ?
	    cfg_scalar(a->interval) : cfg_find_key("upstreams.*.health.interval")->info.def;
	if (a->timeout != NULL)
		cfg_err_at(c, &a->timeout->start_mark, "upstreams.%s.health.timeout: "
		    "%s must be less than health.interval (%s)", u->name, tv, iv);
	else if (a->interval != NULL)
		cfg_err_at(c, &a->interval->start_mark, "upstreams.%s.health.interval: "
		    "%s must be more than health.timeout (%s)", u->name, iv, tv);
}

static void
parse_section(struct ctx *c, struct sl_upstream_conf *u, const char *section,
    yaml_node_t *v, const char *path)
{
	struct section_arg a = { u, section, NULL, NULL };
	int ok;

	cfg_require_mapping(c, v, path, &ok);
	if (!ok)
		return;
	cfg_each_pair(c, v, section_pair, &a);
	if (strcmp(section, "health") == 0) {
		u->health.enabled = 1;
		check_probe_times(c, &a);
	} else if (strcmp(section, "load_metrics") == 0)
		u->load_metrics.enabled = 1;
	else if (strcmp(section, "queue") == 0)
		u->queue.enabled = 1;
}

/* One entry of replicas:. */
struct replica_arg {
	struct sl_upstream_conf *u;
	size_t idx;
	char prefix[288];               /* "upstreams.NAME.replicas[I]" */
	yaml_node_t *url;               /* value node; NULL: no url key */
};

static void
replica_pair(struct ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg)
{
	struct replica_arg *a = arg;
	struct sl_replica_conf *r = &a->u->replicas[a->idx];
	const char *key = cfg_scalar(k);
	const struct field *f;
	char path[320];

	snprintf(path, sizeof(path), "%s.%s", a->prefix, key);
	if (strcmp(key, "url") == 0) {
		a->url = v;
		set_url(c, cfg_find_key("upstreams.*.replicas[].url"), path, v, &r->url);
	} else if ((f = find_field(replica_fields, "upstreams.*.replicas[]",
	    key)) != NULL)
		cfg_set_value(c, cfg_find_key(f->path), path, v, (char *)r + f->off);
	else
		cfg_err_at(c, &k->start_mark, "unknown key '%s' in %s", key, a->prefix);
}

/*
 * replicas: a list of 1..SL_MAX_REPLICAS mappings with distinct URLs
 * (compared after their trailing slashes are stripped).
 */
static void
parse_replicas(struct ctx *c, struct sl_upstream_conf *u, yaml_node_t *v,
    const char *path)
{
	yaml_node_item_t *items;
	struct strset urls;
	size_t n, i;

	if ((n = cfg_list_of_maps(c, v, path, "replica", SL_MAX_REPLICAS, &items)) == 0)
		return;
	u->replicas = calloc(n, sizeof(*u->replicas));
	if (u->replicas == NULL || cfg_strset_init(&urls, n) == -1) {
		cfg_err_at(c, &v->start_mark, "out of memory");
		return;
	}
	for (i = 0; i < n; i++) {
		struct replica_arg a;
		const struct strset_slot *first;
		yaml_node_t *e;
		int alias = cfg_seen_before(c, items[i]), ok;

		if ((e = cfg_node(c, items[i])) == NULL)
			continue;
		memset(&a, 0, sizeof(a));
		a.u = u;
		a.idx = i;
		snprintf(a.prefix, sizeof(a.prefix), "%s[%zu]", path, i);
		fields_default(c, replica_fields, &u->replicas[i]);
		u->nreplicas = i + 1;
		c->quiet += alias;
		cfg_require_mapping(c, e, a.prefix, &ok);
		if (ok) {
			cfg_each_pair(c, e, replica_pair, &a);
			if (a.url == NULL)
				cfg_err_at(c, &e->start_mark,
				    "%s: missing required key 'url'", a.prefix);
			else if (u->replicas[i].url != NULL && !c->quiet &&
			    (first = cfg_strset_add(&urls, u->replicas[i].url,
			    a.url->start_mark.line + 1, i)) != NULL)
				cfg_err_at(c, &a.url->start_mark,
				    "%s.url: duplicate URL '%s' (first at line %zu)",
				    a.prefix, u->replicas[i].url, first->a);
		}
		c->quiet -= alias;
	}
	cfg_strset_free(&urls);
}

/* retry_on: a list of words, maybe empty (never retry). */
static void
parse_retry_on(struct ctx *c, struct sl_upstream_conf *u, yaml_node_t *v,
    const char *path)
{
	yaml_node_item_t *it;

	if (v->type != YAML_SEQUENCE_NODE) {
		cfg_err_at(c, &v->start_mark, "%s: expected a list, got %s", path,
		    cfg_type_name(v));
		return;
	}
	u->retry_on = 0;
	for (it = v->data.sequence.items.start; it < v->data.sequence.items.top;
	    it++) {
		yaml_node_t *w = cfg_node(c, *it);
		const char *s;
		size_t i;

		if (w == NULL || (s = cfg_want_scalar(c, w, path)) == NULL)
			continue;
		for (i = 0; retry_words[i].word != NULL; i++)
			if (strcmp(s, retry_words[i].word) == 0)
				break;
		if (retry_words[i].word == NULL) {
			cfg_err_at(c, &w->start_mark,
			    "%s: '%s' must be one of connect, busy, empty", path, s);
			continue;
		}
		u->retry_on |= retry_words[i].bit;
	}
}

/* present[] of an upstream's named_arg. */
#define UP_URL 0
#define UP_REPLICAS 1

static void
upstream_pair(struct ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg)
{
	struct named_arg *a = arg;
	struct sl_upstream_conf *u = &c->cfg->upstreams[a->idx];
	const char *key = cfg_scalar(k);
	const struct field *f;
	char path[256];

	snprintf(path, sizeof(path), "upstreams.%s.%s", u->name, key);
	if (strcmp(key, "url") == 0 || strcmp(key, "replicas") == 0) {
		/* One form or the other: a url beside a pool is a typo waiting. */
		if (a->present[UP_URL] || a->present[UP_REPLICAS]) {
			cfg_err_at(c, &k->start_mark,
			    "upstream '%s': give 'url' or 'replicas', not both",
			    u->name);
			return;
		}
		if (strcmp(key, "url") == 0) {
			a->present[UP_URL] = 1;
			set_url(c, cfg_find_key("upstreams.*.url"), path, v, &u->url);
		} else {
			a->present[UP_REPLICAS] = 1;
			parse_replicas(c, u, v, path);
		}
	} else if (strcmp(key, "api_key") == 0) {
		if (cfg_is_null(v))
			return;
		cfg_set_value(c, cfg_find_key("upstreams.*.api_key"), path, v, &u->api_key);
		if (u->api_key != NULL && strpbrk(u->api_key, "\r\n") != NULL)
			cfg_err_at(c, &v->start_mark, "%s: must not contain CR or LF",
			    path);
	} else if (strcmp(key, "balance") == 0) {
		const char *s = cfg_want_scalar(c, v, path);
		size_t i;

		if (s == NULL)
			return;
		for (i = 0; balance_words[i] != NULL; i++)
			if (strcmp(s, balance_words[i]) == 0) {
				u->balance = (enum sl_balance)i;
				return;
			}
		cfg_err_at(c, &v->start_mark, "%s: '%s' must be one of least_loaded, "
		    "round_robin, random, prefix_affinity", path, s);
	} else if (strcmp(key, "retry_on") == 0) {
		parse_retry_on(c, u, v, path);
	} else if (strcmp(key, "health") == 0 || strcmp(key, "eject") == 0 ||
	    strcmp(key, "affinity") == 0 || strcmp(key, "load_metrics") == 0 ||
	    strcmp(key, "queue") == 0 || strcmp(key, "response_affinity") == 0) {
		parse_section(c, u, key, v, path);
	} else if ((f = find_field(upstream_fields, "upstreams.*", key)) != NULL) {
		cfg_set_value(c, cfg_find_key(f->path), path, v, (char *)u + f->off);
	} else
		cfg_err_at(c, &k->start_mark, "unknown key '%s' in upstream '%s'",
		    key, u->name);
}

static void
upstreams_pair(struct ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg)
{
	size_t *i = arg;
	struct named_arg a;
	struct sl_upstream_conf *u;
	char path[256];
	int ok;

	memset(&a, 0, sizeof(a));
	a.idx = (*i)++;
	u = &c->cfg->upstreams[a.idx];
	u->name = cfg_strdup(c, cfg_scalar(k));
	upstream_defaults(c, u);
	snprintf(path, sizeof(path), "upstreams.%s", cfg_scalar(k));
	cfg_require_mapping(c, v, path, &ok);
	if (!ok)
		return;
	cfg_each_pair(c, v, upstream_pair, &a);
	if (!a.present[UP_URL] && !a.present[UP_REPLICAS])
		cfg_err_at(c, &v->start_mark,
		    "upstream '%s': missing required key 'url' or 'replicas'",
		    cfg_scalar(k));
	/* url: alone is a pool of one, so the runtime sees one shape. */
	if (u->url != NULL) {
		u->replicas = calloc(1, sizeof(*u->replicas));
		if (u->replicas == NULL) {
			cfg_err_at(c, NULL, "out of memory");
			return;
		}
		fields_default(c, replica_fields, &u->replicas[0]);
		u->replicas[0].url = cfg_strdup(c, u->url);
		u->nreplicas = 1;
	}
}

/* ---- the section ---------------------------------------------------- */

/*
 * upstreams: every upstream, then what only all of them tell: how many
 * replicas and queues in all.
 */
void
cfg_parse_upstreams(struct ctx *c, yaml_node_t *n)
{
	size_t cnt = cfg_map_len(n), idx = 0, i;

	if (cnt == 0)
		cfg_err_at(c, &n->start_mark, "upstreams: at least one is required");
	/* What the shared region has room for (sl_shm.h): as at start. */
	if (cnt > c->cfg->limits.max_upstreams)
		cfg_err_at(c, &n->start_mark, "upstreams: %zu upstreams, "
		    "limits.max_upstreams is %llu", cnt,
		    (unsigned long long)c->cfg->limits.max_upstreams);
	c->cfg->upstreams = calloc(cnt ? cnt : 1, sizeof(*c->cfg->upstreams));
	if (c->cfg->upstreams != NULL) {
		size_t nrep, nq = 0;

		cfg_each_pair(c, n, upstreams_pair, &idx);
		c->cfg->nupstreams = idx;
		nrep = sl_config_nreplicas(c->cfg);
		for (i = 0; i < idx; i++)
			nq += c->cfg->upstreams[i].queue.enabled != 0;
		if (nrep > sl_config_replica_room(c->cfg))
			cfg_err_at(c, &n->start_mark, "upstreams: %zu replicas "
			    "in all, at most %zu (4 per limits.max_upstreams, "
			    "at least 4096)", nrep,
			    sl_config_replica_room(c->cfg));
		if (nq > SL_MAX_QUEUED_UPSTREAMS)
			cfg_err_at(c, &n->start_mark, "upstreams: %zu upstreams "
			    "with a queue, at most %d", nq,
			    SL_MAX_QUEUED_UPSTREAMS);
	}
}

/* ---- what the rest of sluice asks ------------------------------------- */

size_t
sl_config_nreplicas(const struct sl_config *cfg)
{
	size_t i, n = 0;

	for (i = 0; i < cfg->nupstreams; i++)
		n += cfg->upstreams[i].nreplicas;
	return n;
}

size_t
sl_config_replica_room(const struct sl_config *cfg)
{
	size_t n = 4 * (size_t)cfg->limits.max_upstreams;

	return n > SL_REPLICAS_MIN_ROOM ? n : SL_REPLICAS_MIN_ROOM;
}
