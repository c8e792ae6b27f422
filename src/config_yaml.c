/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Configuration, walking the YAML document: nodes (marked seen, so an
 * alias is known), scalars, mappings read pair by pair with duplicate and
 * non-scalar keys reported, lists of mappings; and the string sets that
 * find duplicates in O(n). Problems go to the error reporter; nothing
 * here knows a key of the configuration.
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "sl_config.h"
#include "config_int.h"
#include "sl_util.h"

/* ---- string sets ------------------------------------------------------ */

/*
 * A set of borrowed strings, each with two caller indices, for duplicate
 * detection in O(n) however many names or keys a file holds: open
 * addressing, power-of-two table at most half full, sized once.
 */


/* Room for n strings; -1 on ENOMEM. Free with strset_free. */
int
cfg_strset_init(struct strset *set, size_t n)
{
	size_t size = 8;

	while (size < 2 * n)
		size *= 2;
	set->slots = calloc(size, sizeof(*set->slots));
	set->mask = size - 1;
	return set->slots == NULL ? -1 : 0;
}

void
cfg_strset_free(struct strset *set)
{
	free(set->slots);
	set->slots = NULL;
}

/*
 * Add s with indices a, b. Returns the slot of an equal string already in
 * the set (s is not added), or NULL when s is new. At most n strings (the
 * strset_init argument) may be added.
 */
const struct strset_slot *
cfg_strset_add(struct strset *set, const char *s, size_t a, size_t b)
{
	uint64_t h = sl_hash64(s, strlen(s));
	size_t i;

	for (i = (size_t)h & set->mask; set->slots[i].s != NULL;
	    i = (i + 1) & set->mask)
		if (set->slots[i].hash == h && strcmp(set->slots[i].s, s) == 0)
			return &set->slots[i];
	set->slots[i].hash = h;
	set->slots[i].s = s;
	set->slots[i].a = a;
	set->slots[i].b = b;
	return NULL;
}

/* ---- YAML walking ---------------------------------------------------- */

yaml_node_t *
cfg_node(struct ctx *c, int id)
{
	yaml_node_t *n = yaml_document_get_node(c->doc, id);

	if (n != NULL && id >= 1 && (size_t)id <= c->nnodes) {
		c->seen[id - 1] = 1;
	}
	return n;
}

const char *
cfg_scalar(yaml_node_t *n)
{
	return (const char *)n->data.scalar.value;
}

int
cfg_is_null(yaml_node_t *n)
{
	const char *v;

	if (n->type != YAML_SCALAR_NODE ||
	    n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
		return 0;
	v = cfg_scalar(n);
	return v[0] == '\0' || strcmp(v, "~") == 0 || strcmp(v, "null") == 0 ||
	    strcmp(v, "Null") == 0 || strcmp(v, "NULL") == 0;
}

const char *
cfg_type_name(yaml_node_t *n)
{
	switch (n->type) {
	case YAML_MAPPING_NODE:
		return "a mapping";
	case YAML_SEQUENCE_NODE:
		return "a list";
	default:
		return cfg_is_null(n) ? "null" : "a scalar";
	}
}

/* Expect a scalar; on error report and return NULL. */
const char *
cfg_want_scalar(struct ctx *c, yaml_node_t *n, const char *key)
{
	if (n->type != YAML_SCALAR_NODE || cfg_is_null(n)) {
		cfg_err_at(c, &n->start_mark, "%s: expected a value, got %s", key,
		    cfg_type_name(n));
		return NULL;
	}
	if (strlen(cfg_scalar(n)) != n->data.scalar.length) {
		/* "\0" in a quoted scalar: C strings would cut it short. */
		cfg_err_at(c, &n->start_mark, "%s: NUL characters are not allowed", key);
		return NULL;
	}
	return cfg_scalar(n);
}

char *
cfg_strdup(struct ctx *c, const char *s)
{
	char *d = strdup(s);

	if (d == NULL)
		cfg_err_at(c, NULL, "out of memory");
	return d;
}

/*
 * Iterate a mapping's pairs, reporting non-scalar and duplicate keys.
 * Calls fn for each well-formed pair.
 */
void
cfg_each_pair(struct ctx *c, yaml_node_t *map, cfg_pair_fn fn, void *arg)
{
	yaml_node_pair_t *p;
	struct strset seen;

	if (cfg_strset_init(&seen, (size_t)(map->data.mapping.pairs.top -
	    map->data.mapping.pairs.start)) == -1) {
		cfg_err_at(c, &map->start_mark, "out of memory");
		return;
	}
	for (p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
	    p++) {
		yaml_node_t *k = cfg_node(c, p->key), *v;
		const struct strset_slot *first;
		int alias;

		/* A node reached twice is an alias (prescan() reported it). */
		alias = p->value >= 1 && (size_t)p->value <= c->nnodes &&
		    c->seen[p->value - 1];
		v = cfg_node(c, p->value);
		if (k == NULL || v == NULL)
			continue;
		if (k->type != YAML_SCALAR_NODE) {
			cfg_err_at(c, &k->start_mark, "mapping keys must be scalars");
			continue;
		}
		/* a: the line of the first use, for the message. */
		first = cfg_strset_add(&seen, cfg_scalar(k), k->start_mark.line + 1, 0);
		if (first != NULL) {
			cfg_err_at(c, &k->start_mark,
			    "duplicate key '%s' (first at line %zu)", cfg_scalar(k),
			    first->a);
			continue;
		}
		c->quiet += alias;
		fn(c, k, v, arg);
		c->quiet -= alias;
	}
	cfg_strset_free(&seen);
}

void
cfg_require_mapping(struct ctx *c, yaml_node_t *v, const char *path, int *ok)
{
	*ok = v->type == YAML_MAPPING_NODE;
	if (!*ok)
		cfg_err_at(c, &v->start_mark, "%s: expected a mapping, got %s", path,
		    cfg_type_name(v));
}

yaml_node_t *
cfg_find_child(struct ctx *c, yaml_node_t *map, const char *key)
{
	yaml_node_pair_t *p;

	for (p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
	    p++) {
		yaml_node_t *k = yaml_document_get_node(c->doc, p->key);

		if (k != NULL && k->type == YAML_SCALAR_NODE &&
		    strcmp(cfg_scalar(k), key) == 0)
			return yaml_document_get_node(c->doc, p->value);
	}
	return NULL;
}

size_t
cfg_map_len(yaml_node_t *m)
{
	return (size_t)(m->data.mapping.pairs.top - m->data.mapping.pairs.start);
}

/* A node reached twice is an alias (prescan() reported it). */
int
cfg_seen_before(const struct ctx *c, int id)
{
	return id >= 1 && (size_t)id <= c->nnodes && c->seen[id - 1];
}

/*
 * A list of 1..max entries (replicas, targets): their items in *items and
 * how many to read, at most max (entries past it reported where the first
 * of them is); 0 after reporting a value that is not a list, or is empty.
 * The entries themselves are checked to be mappings by the caller.
 */
size_t
cfg_list_of_maps(struct ctx *c, yaml_node_t *v, const char *path,
    const char *what, size_t max, yaml_node_item_t **items)
{
	size_t n;

	if (v->type != YAML_SEQUENCE_NODE) {
		cfg_err_at(c, &v->start_mark, "%s: expected a list of mappings, got %s",
		    path, cfg_type_name(v));
		return 0;
	}
	*items = v->data.sequence.items.start;
	n = (size_t)(v->data.sequence.items.top - *items);
	if (n == 0) {
		cfg_err_at(c, &v->start_mark, "%s: must hold at least one %s", path, what);
		return 0;
	}
	if (n > max) {
		yaml_node_t *extra = yaml_document_get_node(c->doc, (*items)[max]);

		cfg_err_at(c, extra ? &extra->start_mark : &v->start_mark,
		    "%s: more than %zu %ss", path, max, what);
		n = max;
	}
	return n;
}
