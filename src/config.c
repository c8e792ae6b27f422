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
 * This file holds the top level, the cluster: and tls: checks and the
 * load; the key table and its setter (config_keys.c), the error reporter
 * (config_errors.c), the value parsers, the YAML walking and the
 * upstreams:, models: and tenants: sections are in config_*.c, layered
 * as config_int.h says.
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
#include <arpa/inet.h>
#include <sys/socket.h>

#include "sl_config.h"
#include "config_int.h"

/* ---- the cluster: and tls: blocks, once read --------------------------- */

/* After the top level is read: what only the whole `cluster:` tells. */
static void
check_cluster(struct ctx *c, yaml_node_t *root)
{
	struct sl_cluster_conf *cl = &c->cfg->cluster;
	yaml_node_t *map, *hb, *sn, *mn;
	char host[256];

	map = cfg_find_child(c, root, "cluster");
	if (map == NULL || map->type != YAML_MAPPING_NODE)
		return;
	cl->enabled = 1;
	/*
	 * Exactly one way to find the master, said at the key that is wrong;
	 * a sentinels: list with bad entries was reported already.
	 */
	sn = cfg_find_child(c, map, "sentinels");
	if (cl->redis == NULL && sn == NULL)
		cfg_err_at(c, &map->start_mark, "cluster: missing required key "
		    "'redis' (or 'sentinels')");
	else if (cl->redis != NULL && sn != NULL)
		cfg_err_at(c, &sn->start_mark,
		    "cluster.sentinels: give either redis or sentinels, not both "
		    "(redis is the master's fixed address; sentinels find it)");
	if (sn != NULL && cl->master_name == NULL &&
	    cfg_find_child(c, map, "master_name") == NULL)
		cfg_err_at(c, &sn->start_mark,
		    "cluster: missing required key 'master_name' (the name the "
		    "sentinels monitor) with 'sentinels'");
	else if (sn == NULL && (mn = cfg_find_child(c, map, "master_name")) != NULL)
		cfg_err_at(c, &mn->start_mark,
		    "cluster.master_name: only with 'sentinels'");
	if (sn == NULL && cl->sentinel_password != NULL &&
	    cl->sentinel_password[0] != '\0')
		cfg_err_at(c, &cfg_find_child(c, map, "sentinel_password")->start_mark,
		    "cluster.sentinel_password: only with 'sentinels'");
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
	if (cl->sentinel_password != NULL && cl->sentinel_password[0] == '\0') {
		free(cl->sentinel_password);
		cl->sentinel_password = NULL;
	}
}

#define SENTINELS_MAX 16

/*
 * An IP:port or [v6]:port already checked, as what it connects to: the
 * family, the address and the port.
 */
static void
addr_bin(const char *s, int *af, unsigned char bin[16], long *port)
{
	char host[64];
	const char *colon = strrchr(s, ':');
	size_t n;

	memset(bin, 0, 16);
	*port = strtol(colon + 1, NULL, 10);
	n = (size_t)(colon - s);
	if (s[0] == '[') {
		s++;
		n -= 2;
	}
	if (n >= sizeof(host))
		n = sizeof(host) - 1;
	memcpy(host, s, n);
	host[n] = '\0';
	*af = strchr(host, ':') != NULL ? AF_INET6 : AF_INET;
	(void)inet_pton(*af, host, bin);
}

/* The same sentinel, however written ("[::1]" and "[0::1]", port 026379). */
static int
same_addr(const char *a, const char *b)
{
	unsigned char ba[16], bb[16];
	int fa, fb;
	long pa, pb;

	addr_bin(a, &fa, ba, &pa);
	addr_bin(b, &fb, bb, &pb);
	return fa == fb && pa == pb && memcmp(ba, bb, sizeof(ba)) == 0;
}

/*
 * cluster.sentinels: 1-16 sentinel addresses, each IP:port or [v6]:port
 * (not resolved, as cluster.redis), each once.
 */
static void
parse_sentinels(struct ctx *c, yaml_node_t *v, const char *path)
{
	struct sl_cluster_conf *cl = &c->cfg->cluster;
	yaml_node_item_t *it;
	size_t i, n;

	if (cl->sentinels != NULL)
		return;   /* a duplicate key, reported as one */
	if (v->type != YAML_SEQUENCE_NODE) {
		cfg_err_at(c, &v->start_mark, "%s: expected a list, got %s", path,
		    cfg_type_name(v));
		return;
	}
	n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
	if (n == 0 || n > SENTINELS_MAX) {
		cfg_err_at(c, &v->start_mark, "%s: %zu entries; 1-%d sentinel "
		    "addresses are allowed", path, n, SENTINELS_MAX);
		return;
	}
	if ((cl->sentinels = calloc(n, sizeof(char *))) == NULL) {
		cfg_err_at(c, &v->start_mark, "%s: out of memory", path);
		return;
	}
	for (it = v->data.sequence.items.start; it < v->data.sequence.items.top;
	    it++) {
		yaml_node_t *w = cfg_node(c, *it);
		const char *s;

		if (w == NULL || (s = cfg_want_scalar(c, w, path)) == NULL)
			continue;
		if (strncmp(s, "unix:", 5) == 0 || !cfg_valid_redis_addr(s)) {
			cfg_err_at(c, &w->start_mark, "%s: '%s' is not IP:port or "
			    "[v6]:port (host names are not resolved)", path, s);
			continue;
		}
		for (i = 0; i < cl->nsentinels; i++)
			if (same_addr(cl->sentinels[i], s))
				break;
		if (i < cl->nsentinels && strcmp(cl->sentinels[i], s) == 0) {
			cfg_err_at(c, &w->start_mark, "%s: '%s' is listed twice", path,
			    s);
			continue;
		}
		if (i < cl->nsentinels) {
			cfg_err_at(c, &w->start_mark, "%s: '%s' is listed twice (as "
			    "'%s')", path, s, cl->sentinels[i]);
			continue;
		}
		if ((cl->sentinels[cl->nsentinels] = cfg_strdup(c, s)) != NULL)
			cl->nsentinels++;
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
	a->present[row - cfg_keys] = 1;
	if (strcmp(path, "tls.alpn") == 0) {
		parse_alpn(c, v, path);
		return;
	}
	if (strcmp(path, "cluster.sentinels") == 0) {
		parse_sentinels(c, v, path);
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
		if (row->off == OFF(cluster.master_name) &&
		    c->cfg->cluster.master_name != NULL &&
		    !cfg_valid_node_name(c->cfg->cluster.master_name))
			cfg_err_at(c, &v->start_mark,
			    "%s: '%s' must be 1-64 of A-Z a-z 0-9 . _ -", path,
			    c->cfg->cluster.master_name);
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

	for (k = cfg_keys; k->info.path != NULL; k++) {
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
	unsigned char present[CFG_KEYS_MAX];
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

	for (k = cfg_keys; k->info.path != NULL; k++)
		if (k->required && strchr(k->info.path, '*') == NULL &&
		    !present[k - cfg_keys])
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
			cfg_err_add(errs, msg);
		return -1;
	}
	if (fstat(fd, &st) == -1) {
		if (asprintf(&msg, "%s:1:1: cannot stat: %s", path,
		    strerror(errno)) >= 0)
			cfg_err_add(errs, msg);
		close(fd);
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		if (asprintf(&msg, "%s:1:1: not a regular file (%s)", path,
		    file_kind(st.st_mode)) >= 0)
			cfg_err_add(errs, msg);
		close(fd);
		return -1;
	}
	fp = fdopen(fd, "r");
	if (fp == NULL) {
		if (asprintf(&msg, "%s:1:1: cannot open: %s", path,
		    strerror(errno)) >= 0)
			cfg_err_add(errs, msg);
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
					cfg_err_add(errs, msg);
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
			cfg_err_add(errs, msg);
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

/* Two strings, either NULL. */
static int
same_str(const char *a, const char *b)
{
	return (a == NULL) == (b == NULL) && (a == NULL || strcmp(a, b) == 0);
}

int
sl_cluster_same_place(const struct sl_cluster_conf *o,
    const struct sl_cluster_conf *n)
{
	size_t i;

	if (!same_str(o->redis, n->redis) || !same_str(o->node, n->node) ||
	    !same_str(o->password, n->password) ||
	    !same_str(o->master_name, n->master_name) ||
	    !same_str(o->sentinel_password, n->sentinel_password) ||
	    o->nsentinels != n->nsentinels)
		return 0;
	for (i = 0; i < o->nsentinels; i++)
		if (strcmp(o->sentinels[i], n->sentinels[i]) != 0)
			return 0;
	return 1;
}

void
sl_cluster_place_str(const struct sl_cluster_conf *o, char *buf, size_t len)
{
	size_t i, at;

	if (len == 0)
		return;
	if (!o->enabled)
		snprintf(buf, len, "no cluster");
	else if (o->redis != NULL)
		snprintf(buf, len, "%s", o->redis);
	else {
		at = (size_t)snprintf(buf, len, "sentinels");
		for (i = 0; i < o->nsentinels && at < len; i++)
			at += (size_t)snprintf(buf + at, len - at, "%s%s",
			    i > 0 ? ", " : " ", o->sentinels[i]);
		if (at < len)
			snprintf(buf + at, len - at, " (master '%s')", o->master_name);
	}
}

void
sl_cluster_keep_place(struct sl_cluster_conf *n, const struct sl_cluster_conf *o)
{
	size_t i;

	free(n->redis);
	free(n->node);
	free(n->password);
	free(n->master_name);
	free(n->sentinel_password);
	for (i = 0; i < n->nsentinels; i++)
		free(n->sentinels[i]);
	free(n->sentinels);
	n->enabled = o->enabled;
	n->redis = o->redis ? strdup(o->redis) : NULL;
	n->node = o->node ? strdup(o->node) : NULL;
	n->password = o->password ? strdup(o->password) : NULL;
	n->master_name = o->master_name ? strdup(o->master_name) : NULL;
	n->sentinel_password = o->sentinel_password ?
	    strdup(o->sentinel_password) : NULL;
	n->sentinels = NULL;
	n->nsentinels = 0;
	if (o->nsentinels > 0 &&
	    (n->sentinels = calloc(o->nsentinels, sizeof(char *))) != NULL)
		for (i = 0; i < o->nsentinels; i++)
			if ((n->sentinels[n->nsentinels] = strdup(o->sentinels[i])) !=
			    NULL)
				n->nsentinels++;
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
	for (i = 0; i < cfg->cluster.nsentinels; i++)
		free(cfg->cluster.sentinels[i]);
	free(cfg->cluster.sentinels);
	free(cfg->cluster.master_name);
	free(cfg->cluster.sentinel_password);
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
