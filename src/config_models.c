/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Configuration, the models: section: the names clients send, each with
 * its aliases, targets (an upstream and the model name it is sent as) and
 * fallback list; every name and alias names one model, and the fallbacks
 * make no cycle. Read after the upstreams (targets name them), before the
 * tenants (which name models).
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "sl_config.h"
#include "config_int.h"
#include "sl_util.h"

/* ---- one model -------------------------------------------------------- */


/*
 * A name a client can send and a response header can carry: 1 to
 * SL_MODEL_NAME_MAX bytes, no control character. Reports at v.
 */
static int
valid_model_name(struct ctx *c, yaml_node_t *v, const char *path,
    const char *s)
{
	if (s[0] == '\0' || strlen(s) > SL_MODEL_NAME_MAX || cfg_has_control(s)) {
		cfg_err_at(c, &v->start_mark, "%s: '%s' is not a model name (1-%d "
		    "bytes, no control characters)", path, s, SL_MODEL_NAME_MAX);
		return 0;
	}
	return 1;
}

/*
 * Every name and alias of every model is one name: a second use of one is
 * reported where it is, with the model that has it first.
 */
static void
model_name_add(struct ctx *c, yaml_node_t *v, const char *path,
    const char *s, size_t model)
{
	const struct strset_slot *first;

	if (c->model_set.slots == NULL || c->quiet ||
	    (first = cfg_strset_add(&c->model_set, s, model, 0)) == NULL)
		return;
	cfg_err_at(c, &v->start_mark, "%s: '%s' is already the name or an alias of "
	    "model '%s'", path, s, c->cfg->models[first->a].name);
}

struct target_arg {
	struct sl_model_target *t;
	char prefix[352];               /* "models.NAME.targets[I]" */
	yaml_node_t *upstream;          /* value node; NULL: no upstream key */
};

static void
target_pair(struct ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg)
{
	struct target_arg *a = arg;
	const char *key = cfg_scalar(k), *s;
	char path[384];
	size_t u;

	snprintf(path, sizeof(path), "%s.%s", a->prefix, key);
	if (strcmp(key, "upstream") == 0) {
		a->upstream = v;
		if ((s = cfg_want_scalar(c, v, path)) == NULL)
			return;
		for (u = 0; u < c->cfg->nupstreams; u++)
			if (c->cfg->upstreams[u].name != NULL &&
			    strcmp(c->cfg->upstreams[u].name, s) == 0) {
				a->t->upstream_idx = u;
				free(a->t->upstream);
				a->t->upstream = cfg_strdup(c, s);
				return;
			}
		cfg_err_at(c, &v->start_mark, "%s: no upstream named '%s'", path, s);
	} else if (strcmp(key, "model") == 0) {
		if ((s = cfg_want_scalar(c, v, path)) == NULL)
			return;
		if (s[0] == '\0' || cfg_has_control(s)) {
			cfg_err_at(c, &v->start_mark, "%s: must be non-empty, without "
			    "control characters", path);
			return;
		}
		free(a->t->model);
		a->t->model = cfg_strdup(c, s);
	} else if (strcmp(key, "weight") == 0) {
		cfg_set_value(c, cfg_find_key("models.*.targets[].weight"), path, v,
		    &a->t->weight);
	} else
		cfg_err_at(c, &k->start_mark, "unknown key '%s' in %s", key, a->prefix);
}

static void
parse_targets(struct ctx *c, struct sl_model_conf *m, yaml_node_t *v,
    const char *path)
{
	yaml_node_item_t *items;
	size_t n, i;

	if ((n = cfg_list_of_maps(c, v, path, "target", SL_MAX_TARGETS, &items)) == 0)
		return;
	if ((m->targets = calloc(n, sizeof(*m->targets))) == NULL) {
		cfg_err_at(c, &v->start_mark, "out of memory");
		return;
	}
	for (i = 0; i < n; i++) {
		struct target_arg a;
		yaml_node_t *e;
		int alias = cfg_seen_before(c, items[i]), ok;

		if ((e = cfg_node(c, items[i])) == NULL)
			continue;
		memset(&a, 0, sizeof(a));
		a.t = &m->targets[i];
		a.t->weight = 1;
		m->ntargets = i + 1;
		snprintf(a.prefix, sizeof(a.prefix), "%s[%zu]", path, i);
		c->quiet += alias;
		cfg_require_mapping(c, e, a.prefix, &ok);
		if (ok) {
			cfg_each_pair(c, e, target_pair, &a);
			if (a.upstream == NULL)
				cfg_err_at(c, &e->start_mark,
				    "%s: missing required key 'upstream'", a.prefix);
		}
		if (a.t->model == NULL && m->name != NULL)
			a.t->model = cfg_strdup(c, m->name);
		c->quiet -= alias;
	}
}

struct model_arg {
	size_t idx;
	int has_targets;
};

static void
model_pair(struct ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg)
{
	struct model_arg *a = arg;
	struct sl_model_conf *m = &c->cfg->models[a->idx];
	const char *key = cfg_scalar(k);
	char path[300];

	snprintf(path, sizeof(path), "models.%s.%s", m->name, key);
	if (strcmp(key, "aliases") == 0) {
		yaml_node_item_t *it;
		size_t n;

		if (v->type != YAML_SEQUENCE_NODE) {
			cfg_err_at(c, &v->start_mark, "%s: expected a list of strings, "
			    "got %s", path, cfg_type_name(v));
			return;
		}
		n = (size_t)(v->data.sequence.items.top -
		    v->data.sequence.items.start);
		if (n == 0)
			return;
		if ((m->aliases = calloc(n, sizeof(char *))) == NULL) {
			cfg_err_at(c, NULL, "out of memory");
			return;
		}
		for (it = v->data.sequence.items.start;
		    it < v->data.sequence.items.top; it++) {
			yaml_node_t *an = cfg_node(c, *it);
			const char *s;

			if (an == NULL || (s = cfg_want_scalar(c, an, path)) == NULL ||
			    !valid_model_name(c, an, path, s))
				continue;
			if ((m->aliases[m->naliases] = cfg_strdup(c, s)) == NULL)
				continue;
			model_name_add(c, an, path, m->aliases[m->naliases],
			    a->idx);
			m->naliases++;
		}
	} else if (strcmp(key, "targets") == 0) {
		a->has_targets = 1;
		parse_targets(c, m, v, path);
	} else if (strcmp(key, "fallback") == 0) {
		if (v->type != YAML_SEQUENCE_NODE) {
			cfg_err_at(c, &v->start_mark, "%s: expected a list of strings, "
			    "got %s", path, cfg_type_name(v));
			return;
		}
		c->fallback_nodes[a->idx] = v;   /* resolved once all are named */
	} else
		cfg_err_at(c, &k->start_mark, "unknown key '%s' in model '%s'", key,
		    m->name);
}

static void
models_pair(struct ctx *c, yaml_node_t *k, yaml_node_t *v, void *arg)
{
	size_t *i = arg;
	struct model_arg a;
	struct sl_model_conf *m;
	char path[320];
	int ok;

	memset(&a, 0, sizeof(a));
	a.idx = (*i)++;
	m = &c->cfg->models[a.idx];
	m->name = cfg_strdup(c, cfg_scalar(k));
	snprintf(path, sizeof(path), "models.%s", cfg_scalar(k));
	if (m->name != NULL && valid_model_name(c, k, "models", m->name))
		model_name_add(c, k, "models", m->name, a.idx);
	cfg_require_mapping(c, v, path, &ok);
	if (!ok)
		return;
	cfg_each_pair(c, v, model_pair, &a);
	if (!a.has_targets)
		cfg_err_at(c, &v->start_mark, "model '%s': missing required key "
		    "'targets'", cfg_scalar(k));
}

/* ---- the section: name table, fallbacks ------------------------------ */

/* The name -> model table, from every name and alias; -1 on ENOMEM. */
static int
build_model_names(struct sl_config *cfg)
{
	size_t n = 0, size = 8, i, j;

	for (i = 0; i < cfg->nmodels; i++)
		n += 1 + cfg->models[i].naliases;
	while (size < 2 * n)
		size *= 2;
	if ((cfg->model_names = calloc(size, sizeof(*cfg->model_names))) == NULL)
		return -1;
	cfg->model_mask = size - 1;
	for (i = 0; i < cfg->nmodels; i++)
		for (j = 0; j <= cfg->models[i].naliases; j++) {
			const char *s = j == 0 ? cfg->models[i].name :
			    cfg->models[i].aliases[j - 1];
			size_t len, h;

			if (s == NULL)
				continue;
			len = strlen(s);
			for (h = (size_t)sl_hash64(s, len) & cfg->model_mask;
			    cfg->model_names[h].name != NULL;
			    h = (h + 1) & cfg->model_mask)
				if (cfg->model_names[h].len == len &&
				    memcmp(cfg->model_names[h].name, s, len) == 0)
					break;   /* a clash, reported already */
			if (cfg->model_names[h].name != NULL)
				continue;
			cfg->model_names[h].name = s;
			cfg->model_names[h].len = len;
			cfg->model_names[h].model = i;
		}
	return 0;
}

/*
 * fallback: lists, once every model is named: each entry a model's name or
 * alias, not the model itself. Then no cycle: a walk from each model along
 * the lists must not come back to a model on its path; the entry that
 * closes a cycle is reported.
 */
static void
parse_fallbacks(struct ctx *c)
{
	struct sl_config *cfg = c->cfg;
	yaml_mark_t **marks;
	size_t m, j, *stack, *pos, sp;
	unsigned char *state;   /* 0 unseen, 1 on the path, 2 done */

	if ((marks = calloc(cfg->nmodels, sizeof(*marks))) == NULL)
		goto oom;
	for (m = 0; m < cfg->nmodels; m++) {
		yaml_node_t *v = c->fallback_nodes[m];
		yaml_node_item_t *it;
		char path[300];
		size_t n;

		if (v == NULL)
			continue;
		snprintf(path, sizeof(path), "models.%s.fallback",
		    cfg->models[m].name);
		n = (size_t)(v->data.sequence.items.top -
		    v->data.sequence.items.start);
		cfg->models[m].fallback = calloc(n ? n : 1, sizeof(size_t));
		marks[m] = calloc(n ? n : 1, sizeof(yaml_mark_t));
		if (cfg->models[m].fallback == NULL || marks[m] == NULL)
			goto oom_free;
		for (it = v->data.sequence.items.start;
		    it < v->data.sequence.items.top; it++) {
			yaml_node_t *fn = cfg_node(c, *it);
			const char *s;
			int f;

			if (fn == NULL || (s = cfg_want_scalar(c, fn, path)) == NULL)
				continue;
			if ((f = sl_config_model_find(cfg, s, strlen(s))) < 0) {
				cfg_err_at(c, &fn->start_mark, "%s: no model named '%s'",
				    path, s);
				continue;
			}
			marks[m][cfg->models[m].nfallback] = fn->start_mark;
			cfg->models[m].fallback[cfg->models[m].nfallback++] =
			    (size_t)f;
		}
	}
	/* Depth-first, iterative: a long chain must not overflow the stack. */
	state = calloc(cfg->nmodels, 1);
	stack = calloc(cfg->nmodels, sizeof(*stack));
	pos = calloc(cfg->nmodels, sizeof(*pos));
	if (state == NULL || stack == NULL || pos == NULL) {
		free(state);
		free(stack);
		free(pos);
		goto oom_free;
	}
	for (m = 0; m < cfg->nmodels; m++) {
		if (state[m] != 0)
			continue;
		sp = 0;
		stack[sp] = m;
		pos[sp++] = 0;
		state[m] = 1;
		while (sp > 0) {
			size_t top = stack[sp - 1], k = pos[sp - 1]++, f;

			if (k == cfg->models[top].nfallback) {
				state[top] = 2;
				sp--;
				continue;
			}
			f = cfg->models[top].fallback[k];
			if (state[f] == 1) {
				cfg_err_at(c, &marks[top][k], "models.%s.fallback: '%s' "
				    "makes a cycle of fallbacks", cfg->models[top].name,
				    cfg->models[f].name);
			} else if (state[f] == 0) {
				state[f] = 1;
				stack[sp] = f;
				pos[sp++] = 0;
			}
		}
	}
	free(state);
	free(stack);
	free(pos);
	for (j = 0; j < cfg->nmodels; j++)
		free(marks[j]);
	free(marks);
	return;
oom_free:
	for (j = 0; j < cfg->nmodels; j++)
		free(marks[j]);
	free(marks);
oom:
	cfg_err_at(c, NULL, "out of memory");
}

/* models: parsed after upstreams (targets name them), before tenants. */
void
cfg_parse_models(struct ctx *c, yaml_node_t *n)
{
	size_t cnt = cfg_map_len(n), idx = 0, names = 0;
	yaml_node_pair_t *p;

	if (cnt == 0) {
		cfg_err_at(c, &n->start_mark, "models: at least one is required "
		    "(or no models: section)");
		return;
	}
	if (cnt > c->cfg->limits.max_models) {
		/* Each has its own metrics, in a region sized at start. */
		cfg_err_at(c, &n->start_mark, "models: %zu models, "
		    "limits.max_models is %llu", cnt,
		    (unsigned long long)c->cfg->limits.max_models);
		return;
	}
	/* Room in the name set for every name and alias written. */
	for (p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top;
	    p++) {
		yaml_node_t *v = yaml_document_get_node(c->doc, p->value), *al;

		names++;
		if (v != NULL && v->type == YAML_MAPPING_NODE &&
		    (al = cfg_find_child(c, v, "aliases")) != NULL &&
		    al->type == YAML_SEQUENCE_NODE)
			names += (size_t)(al->data.sequence.items.top -
			    al->data.sequence.items.start);
	}
	c->cfg->models = calloc(cnt, sizeof(*c->cfg->models));
	c->fallback_nodes = calloc(cnt, sizeof(*c->fallback_nodes));
	if (c->cfg->models == NULL || c->fallback_nodes == NULL ||
	    cfg_strset_init(&c->model_set, names) == -1) {
		cfg_err_at(c, &n->start_mark, "out of memory");
		free(c->fallback_nodes);
		c->fallback_nodes = NULL;
		return;
	}
	cfg_each_pair(c, n, models_pair, &idx);
	c->cfg->nmodels = idx;
	cfg_strset_free(&c->model_set);
	if (build_model_names(c->cfg) == -1)
		cfg_err_at(c, &n->start_mark, "out of memory");
	else
		parse_fallbacks(c);
	free(c->fallback_nodes);
	c->fallback_nodes = NULL;
}

/* ---- what the rest of sluice asks ------------------------------------- */

int
sl_config_model_find(const struct sl_config *cfg, const char *name, size_t len)
{
	size_t i;

	if (cfg->model_names == NULL)
		return -1;
	for (i = (size_t)sl_hash64(name, len) & cfg->model_mask;
	    cfg->model_names[i].name != NULL; i = (i + 1) & cfg->model_mask)
		if (cfg->model_names[i].len == len &&
		    memcmp(cfg->model_names[i].name, name, len) == 0)
			return (int)cfg->model_names[i].model;
	return -1;
}
