/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Configuration, the tenants: section: each tenant's API keys, stream and
 * token limits, weight and priority, its upstream and the models it may
 * use. Read last: a tenant names upstreams and models. Every key names
 * exactly one tenant.
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "sl_config.h"
#include "config_int.h"

/* ---- one tenant ------------------------------------------------------- */

static int
cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* tenants.NAME.models: model names (not aliases) of models: */
static void
parse_tenant_models(struct ctx *c, struct sl_tenant_conf *t, yaml_node_t *v,
    const char *path)
{
	yaml_node_item_t *it;
	size_t i, j;

	if (v->type != YAML_SEQUENCE_NODE) {
		cfg_err_at(c, &v->start_mark, "%s: expected a list of strings, got %s",
		    path, cfg_type_name(v));
		return;
	}
	free(t->allowed);
	t->nallowed = 0;
	if ((t->allowed = calloc((size_t)(v->data.sequence.items.top -
	    v->data.sequence.items.start) + 1, sizeof(*t->allowed))) == NULL) {
		cfg_err_at(c, NULL, "out of memory");
		return;
	}
	for (it = v->data.sequence.items.start; it < v->data.sequence.items.top;
	    it++) {
		yaml_node_t *mn = cfg_node(c, *it);
		const char *s;
		int m;

		if (mn == NULL || (s = cfg_want_scalar(c, mn, path)) == NULL)
			continue;
		if ((m = sl_config_model_find(c->cfg, s, strlen(s))) < 0) {
			cfg_err_at(c, &mn->start_mark, "%s: no model named '%s'%s", path,
			    s, !c->models_section ? " (there is no models: "
			    "section)" : "");
			continue;
		}
		if (strcmp(c->cfg->models[m].name, s) != 0) {
			cfg_err_at(c, &mn->start_mark, "%s: '%s' is an alias of model "
			    "'%s': list models by their name", path, s,
			    c->cfg->models[m].name);
			continue;
		}
		t->allowed[t->nallowed++] = (uint32_t)m;
	}
	qsort(t->allowed, t->nallowed, sizeof(*t->allowed), cmp_u32);
	for (i = j = 0; i < t->nallowed; i++)   /* a model listed twice: once */
		if (j == 0 || t->allowed[j - 1] != t->allowed[i])
			t->allowed[j++] = t->allowed[i];
	t->nallowed = j;
}

static void
tenant_pair(struct ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg)
{
	struct named_arg *a = arg;
	struct sl_tenant_conf *t = &c->cfg->tenants[a->idx];
	const char *key = cfg_scalar(k);
	char path[256];

	snprintf(path, sizeof(path), "tenants.%s.%s", t->name, key);
	if (strcmp(key, "keys") == 0) {
		yaml_node_item_t *it;
		size_t n;

		a->present[0] = 1;
		if (v->type != YAML_SEQUENCE_NODE) {
			cfg_err_at(c, &v->start_mark, "%s: expected a list of strings, got %s",
			    path, cfg_type_name(v));
			return;
		}
		n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
		if (n == 0) {
			cfg_err_at(c, &v->start_mark, "%s: must hold at least one key", path);
			return;
		}
		t->keys = calloc(n, sizeof(char *));
		c->key_marks_tenant[a->idx] = calloc(n, sizeof(yaml_mark_t));
		if (t->keys == NULL || c->key_marks_tenant[a->idx] == NULL) {
			cfg_err_at(c, NULL, "out of memory");
			return;
		}
		for (it = v->data.sequence.items.start;
		    it < v->data.sequence.items.top; it++) {
			yaml_node_t *kn = cfg_node(c, *it);
			const char *s;

			if (kn == NULL || (s = cfg_want_scalar(c, kn, path)) == NULL)
				continue;
			if (!cfg_valid_api_key(s)) {
				cfg_err_at(c, &kn->start_mark, "%s: a key must be "
				    "non-empty, without spaces or control characters",
				    path);
				continue;
			}
			if (c->quiet)
				continue;   /* aliased keys would "share" with the anchor */
			c->key_marks_tenant[a->idx][t->nkeys] = kn->start_mark;
			t->keys[t->nkeys++] = cfg_strdup(c, s);
		}
	} else if (strcmp(key, "max_streams") == 0) {
		a->present[1] = 1;
		cfg_set_value(c, cfg_find_key("tenants.*.max_streams"), path, v,
		    &t->max_streams);
	} else if (strcmp(key, "retry_after") == 0) {
		cfg_set_value(c, cfg_find_key("tenants.*.retry_after"), path, v,
		    &t->retry_after);
	} else if (strcmp(key, "tokens_per_minute") == 0) {
		cfg_set_value(c, cfg_find_key("tenants.*.tokens_per_minute"), path, v,
		    &t->tokens_per_minute);
	} else if (strcmp(key, "weight") == 0) {
		cfg_set_value(c, cfg_find_key("tenants.*.weight"), path, v, &t->weight);
	} else if (strcmp(key, "priority") == 0) {
		cfg_set_value(c, cfg_find_key("tenants.*.priority"), path, v, &t->priority);
	} else if (strcmp(key, "upstream") == 0) {
		cfg_set_value(c, cfg_find_key("tenants.*.upstream"), path, v, &t->upstream);
		a->upstream_node = v;
	} else if (strcmp(key, "models") == 0) {
		parse_tenant_models(c, t, v, path);
	} else
		cfg_err_at(c, &k->start_mark, "unknown key '%s' in tenant '%s'", key,
		    t->name);
}

static void
tenants_pair(struct ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg)
{
	size_t *i = arg;
	struct named_arg a;
	struct sl_tenant_conf *t;
	char path[256];
	int ok;
	size_t u;

	memset(&a, 0, sizeof(a));
	a.idx = (*i)++;
	t = &c->cfg->tenants[a.idx];
	t->name = cfg_strdup(c, cfg_scalar(k));
	if (cfg_scalar(k)[0] == '\0')
		cfg_err_at(c, &k->start_mark, "tenants: a tenant name must not be empty");
	else if (cfg_has_control(cfg_scalar(k)))
		/* Names go into metric labels, logs and Redis keys. */
		cfg_err_at(c, &k->start_mark,
		    "tenants: a tenant name must not contain control characters");
	else if (strcmp(cfg_scalar(k), "-") == 0)
		/* "-" stands for "no tenant" in the access log and metrics. */
		cfg_err_at(c, &k->start_mark,
		    "tenants: '-' is not a tenant name: it stands for no tenant "
		    "in the access log and metrics");
	t->retry_after = 1;
	t->max_streams = -1;
	t->weight = 1;
	t->priority = 0;
	snprintf(path, sizeof(path), "tenants.%s", cfg_scalar(k));
	cfg_require_mapping(c, v, path, &ok);
	if (!ok)
		return;
	cfg_each_pair(c, v, tenant_pair, &a);
	if (!a.present[0])
		cfg_err_at(c, &v->start_mark, "tenant '%s': missing required key 'keys'",
		    cfg_scalar(k));
	if (!a.present[1])
		cfg_err_at(c, &v->start_mark,
		    "tenant '%s': missing required key 'max_streams'", cfg_scalar(k));
	if (t->upstream == NULL) {
		/* With models: a request naming none gets 400 instead. */
		if (c->models_section)
			return;
		if (c->cfg->nupstreams == 1) {
			t->upstream_idx = 0;
			t->has_upstream = 1;
			return;
		}
		if (c->cfg->nupstreams > 1)
			cfg_err_at(c, &v->start_mark,
			    "tenant '%s': missing key 'upstream' (there are %zu upstreams)",
			    cfg_scalar(k), c->cfg->nupstreams);
		return;
	}
	for (u = 0; u < c->cfg->nupstreams; u++)
		if (c->cfg->upstreams[u].name != NULL &&
		    strcmp(c->cfg->upstreams[u].name, t->upstream) == 0) {
			t->upstream_idx = u;
			t->has_upstream = 1;
			return;
		}
	cfg_err_at(c, &a.upstream_node->start_mark,
	    "tenants.%s.upstream: no upstream named '%s'", cfg_scalar(k), t->upstream);
}


/* ---- the section ---------------------------------------------------- */

/*
 * A key must name exactly one tenant. Each repeat is reported once, where
 * it is, with the tenant that listed the key first.
 */
static void
check_cross(struct ctx *c, yaml_node_t *tenants)
{
	struct sl_config *cfg = c->cfg;
	struct strset keyset;
	size_t n = 0, j, b;

	for (j = 0; j < cfg->ntenants; j++)
		n += cfg->tenants[j].nkeys;
	if (cfg_strset_init(&keyset, n) == -1) {
		cfg_err_at(c, &tenants->start_mark, "out of memory");
		return;
	}
	for (j = 0; j < cfg->ntenants; j++)
		for (b = 0; b < cfg->tenants[j].nkeys; b++) {
			const struct strset_slot *first;
			const char *y = cfg->tenants[j].keys[b];
			size_t i;

			if (y == NULL ||
			    (first = cfg_strset_add(&keyset, y, j, b)) == NULL)
				continue;
			i = first->a;
			cfg_err_at(c, c->key_marks_tenant[j] ?
			    &c->key_marks_tenant[j][b] : &tenants->start_mark,
			    i == j ? "tenant '%s' lists the same key twice%s" :
			    "tenants '%s' and '%s' share a key",
			    cfg->tenants[i].name, i == j ? "" : cfg->tenants[j].name);
		}
	cfg_strset_free(&keyset);
}

/*
 * tenants: every tenant, then what only all of them tell: no API key
 * names two tenants (or one twice).
 */
void
cfg_parse_tenants(struct ctx *c, yaml_node_t *n)
{
	size_t cnt = cfg_map_len(n), idx = 0, i;

	if (cnt == 0)
		cfg_err_at(c, &n->start_mark, "tenants: at least one is required");
	if (cnt > c->cfg->limits.max_tenants)
		cfg_err_at(c, &n->start_mark, "tenants: %zu tenants, "
		    "limits.max_tenants is %llu", cnt,
		    (unsigned long long)c->cfg->limits.max_tenants);
	c->cfg->tenants = calloc(cnt ? cnt : 1, sizeof(*c->cfg->tenants));
	c->key_marks_tenant = calloc(cnt ? cnt : 1, sizeof(yaml_mark_t *));
	if (c->cfg->tenants != NULL && c->key_marks_tenant != NULL) {
		cfg_each_pair(c, n, tenants_pair, &idx);
		c->cfg->ntenants = idx;
		check_cross(c, n);
	}
	if (c->key_marks_tenant != NULL) {
		for (i = 0; i < cnt; i++)
			free(c->key_marks_tenant[i]);
		free(c->key_marks_tenant);
		c->key_marks_tenant = NULL;
	}
}

/* ---- what the rest of sluice asks ------------------------------------- */

int
sl_tenant_allows(const struct sl_tenant_conf *t, size_t m)
{
	size_t lo = 0, hi = t->nallowed, mid;

	if (t->allowed == NULL)
		return 1;
	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (t->allowed[mid] == m)
			return 1;
		if (t->allowed[mid] < m)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

int
sl_config_tenant_index(const struct sl_config *cfg, const char *name)
{
	size_t i;

	for (i = 0; i < cfg->ntenants; i++)
		if (strcmp(cfg->tenants[i].name, name) == 0)
			return (int)i;
	return -1;
}
