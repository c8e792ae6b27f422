/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Prompt-prefix affinity: block hashes, the per-worker LRU table and
 * rendezvous hashing declared in sl_affinity.h.
 *
 * The hash. A chained, streaming function of bytes: block i starts from
 * acc = h[i-1] + P5 (P5 alone for block 0), takes the block's bytes as
 * 64-bit words assembled little-endian byte by byte (the same on every
 * host), one xxh64-style round per word, the last partial word zero
 * padded, then the block's length and the xxh64 avalanche. It streams, so
 * a prompt made of many message contents is hashed without copying it, and
 * where the contents are cut does not matter. Not cryptographic: a client
 * who engineers collisions only changes where its own requests go.
 *
 * The table. Entries live in one array with a doubly linked recency list
 * (head = most recently recorded) and a free list, both by index; an open
 * addressing index with linear probing maps (upstream, hash) to an entry.
 * Deletion shifts later probe-chain members back into the hole (Knuth's
 * algorithm R), so there are no tombstones and probe chains stay short at
 * a load factor <= 1/2. Nothing is allocated after sl_affinity_new().
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "sl_affinity.h"
#include "sl_json.h"

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static uint64_t
rotl64(uint64_t x, unsigned r)
{
	return (x << r) | (x >> (64 - r));
}

static uint64_t
round64(uint64_t acc, uint64_t w)
{
	acc += w * P2;
	acc = rotl64(acc, 31);
	return acc * P1;
}

static uint64_t
avalanche(uint64_t h)
{
	h ^= h >> 33;
	h *= P2;
	h ^= h >> 29;
	h *= P3;
	h ^= h >> 32;
	return h;
}

/* splitmix64's finaliser: a bijection with full avalanche. */
static uint64_t
fmix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xBF58476D1CE4E5B9ULL;
	x ^= x >> 27;
	x *= 0x94D049BB133111EBULL;
	x ^= x >> 31;
	return x;
}

static uint64_t
le64(const unsigned char *p)
{
	return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 |
	    (uint64_t)p[3] << 24 | (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 |
	    (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}

/* ------------------------------------------------------------ block chain */

struct chain {
	size_t block, max, count;
	uint64_t *h;
	uint64_t acc;      /* state of the block being hashed */
	uint64_t word;     /* bytes of the current word, little-endian */
	unsigned nw;       /* bytes in word */
	size_t nb;         /* bytes of the current block */
};

static void
chain_init(struct chain *c, size_t block, uint64_t *h, size_t max)
{
	memset(c, 0, sizeof(*c));
	c->block = block;
	c->h = h;
	c->max = max;
	c->acc = P5;
}

static uint64_t
chain_finish(struct chain *c)
{
	uint64_t acc = c->acc;

	if (c->nw > 0)
		acc = round64(acc, c->word);
	acc ^= (uint64_t)c->nb * P1;
	return avalanche(acc);
}

/* Absorb p[0..n); returns 1 once max hashes are out (nothing more to do). */
static int
chain_feed(struct chain *c, const unsigned char *p, size_t n)
{
	size_t i = 0;

	if (c->count >= c->max)
		return 1;
	while (i < n) {
		if (c->nw == 0 && n - i >= 8 && c->block - c->nb >= 8) {
			c->acc = round64(c->acc, le64(p + i));
			i += 8;
			c->nb += 8;
		} else {
			c->word |= (uint64_t)p[i] << (8 * c->nw);
			i++;
			c->nb++;
			if (++c->nw == 8) {
				c->acc = round64(c->acc, c->word);
				c->word = 0;
				c->nw = 0;
			}
		}
		if (c->nb == c->block) {
			c->h[c->count] = chain_finish(c);
			c->acc = c->h[c->count] + P5;
			c->count++;
			c->word = 0;
			c->nw = 0;
			c->nb = 0;
			if (c->count >= c->max)
				return 1;
		}
	}
	return 0;
}

static size_t
chain_end(struct chain *c)
{
	if (c->count == 0 && c->nb > 0 && c->max > 0)
		c->h[c->count++] = chain_finish(c);
	return c->count;
}

size_t
sl_affinity_hash_text(const char *text, size_t len, size_t block, uint64_t *h, size_t max)
{
	struct chain c;

	if (block == 0 || max == 0)
		return 0;
	chain_init(&c, block, h, max);
	chain_feed(&c, (const unsigned char *)text, len);
	return chain_end(&c);
}

static int
feed_string(struct chain *c, const json_t *s)
{
	if (!json_is_string(s))
		return 0;
	return chain_feed(c, (const unsigned char *)json_string_value(s), json_string_length(s));
}

size_t
sl_affinity_hashes_json(const json_t *root, size_t block, uint64_t *h, size_t max)
{
	struct chain c;
	const json_t *msgs, *m, *content, *part, *type, *prompt, *el;
	size_t i, k;
	int done = 0;

	if (block == 0 || max == 0 || !json_is_object(root))
		return 0;
	chain_init(&c, block, h, max);
	msgs = json_object_get(root, "messages");
	if (json_is_array(msgs)) {
		for (i = 0; i < json_array_size(msgs) && !done; i++) {
			m = json_array_get(msgs, i);
			content = json_is_object(m) ? json_object_get(m, "content") : NULL;
			if (json_is_string(content)) {
				done = feed_string(&c, content);
				continue;
			}
			if (!json_is_array(content))
				continue;
			for (k = 0; k < json_array_size(content) && !done; k++) {
				part = json_array_get(content, k);
				if (!json_is_object(part))
					continue;
				type = json_object_get(part, "type");
				if (json_is_string(type) && strcmp(json_string_value(type), "text") == 0 &&
				    json_string_length(type) == 4)
					done = feed_string(&c, json_object_get(part, "text"));
			}
		}
		return chain_end(&c);
	}
	prompt = json_object_get(root, "prompt");
	if (json_is_string(prompt)) {
		feed_string(&c, prompt);
	} else if (json_is_array(prompt)) {
		for (i = 0; i < json_array_size(prompt) && !done; i++) {
			el = json_array_get(prompt, i);
			done = feed_string(&c, el);
		}
	}
	return chain_end(&c);
}

static int
chain_sink(void *arg, const unsigned char *b, size_t n)
{
	return chain_feed(arg, b, n);
}

/* Feed the string at v, if it is one; 1 once the chain is full. */
static int
feed_text(struct chain *c, const char *p, struct sl_json_span v)
{
	if (p[v.vs] != '"')
		return 0;
	return sl_json_decode(p, v.vs, v.ve, chain_sink, c);
}

/* A content part: {"type":"text","text":"..."} feeds its text. */
static int
feed_part(struct chain *c, const char *p, size_t len, size_t i)
{
	struct sl_json_span t;
	size_t close, n;
	int found;

	if (p[i] != '{' || sl_json_find(p, len, i, "type", &t, &found, &close, &n) < 0 ||
	    !found || p[t.vs] != '"' || !sl_json_key_is(p, t.vs, t.ve, "text") ||
	    sl_json_find(p, len, i, "text", &t, &found, &close, &n) < 0 || !found)
		return 0;
	return feed_text(c, p, t);
}

/*
 * The same blocks as sl_affinity_hashes_json() over jansson's tree, read
 * from the text instead: one validating pass and walks that build nothing,
 * so a body of megabytes costs its worker no tree.
 */
size_t
sl_affinity_hashes(const char *body, size_t len, size_t block, uint64_t *h, size_t max)
{
	struct sl_json_member m[2] = { { "messages", { 0, 0 }, 0 }, { "prompt", { 0, 0 }, 0 } };
	struct sl_json_span v;
	struct chain c;
	size_t open, close, n, i, k, cl, nn;
	int found, done = 0, more, more2;

	if (block == 0 || max == 0 ||
	    sl_json_object(body, len, m, 2, &open, &close, &n) < 0)
		return 0;
	chain_init(&c, block, h, max);
	if (m[0].found && body[m[0].v.vs] == '[') {
		i = m[0].v.vs;
		for (more = sl_json_first(body, len, &i); more && !done;
		    more = sl_json_after(body, len, &i)) {
			if (body[i] == '{' &&
			    sl_json_find(body, len, i, "content", &v, &found, &cl, &nn) == 0 &&
			    found) {
				if (body[v.vs] == '"')
					done = feed_text(&c, body, v);
				else if (body[v.vs] == '[') {
					k = v.vs;
					for (more2 = sl_json_first(body, len, &k); more2 && !done;
					    more2 = sl_json_after(body, len, &k)) {
						done = feed_part(&c, body, len, k);
						if (sl_json_skip(body, len, &k) < 0)
							return chain_end(&c);
					}
				}
			}
			if (sl_json_skip(body, len, &i) < 0)
				break;
		}
		return chain_end(&c);
	}
	if (m[1].found) {
		v = m[1].v;
		if (body[v.vs] == '"')
			feed_text(&c, body, v);
		else if (body[v.vs] == '[') {
			i = v.vs;
			for (more = sl_json_first(body, len, &i); more && !done;
			    more = sl_json_after(body, len, &i)) {
				k = i;
				if (sl_json_skip(body, len, &k) < 0)
					break;
				if (body[i] == '"')
					done = feed_text(&c, body, (struct sl_json_span){ i, k });
				i = k;
			}
		}
	}
	return chain_end(&c);
}

uint64_t
sl_affinity_id(const char *s)
{
	struct chain c;
	uint64_t h;
	size_t n = strlen(s);

	/* One "block" of the whole string, from its own seed. */
	chain_init(&c, n + 1, &h, 1);
	c.acc = P4;
	chain_feed(&c, (const unsigned char *)s, n);
	return chain_finish(&c);
}

int
sl_affinity_rendezvous(uint64_t key, const uint64_t *ids, size_t n)
{
	return sl_affinity_rendezvous_weighted(key, ids, NULL, n);
}

/*
 * Weighted rendezvous (Schindelhauer and Schomaker): each candidate's hash
 * as u in (0, 1), score w / -ln(u); the highest wins, and a candidate wins
 * w_i / sum(w) of the keys. With equal weights the order of the scores is
 * the order of the hashes, so the choice is the unweighted one.
 */
int
sl_affinity_rendezvous_weighted(uint64_t key, const uint64_t *ids, const int *weights,
    size_t n)
{
	size_t i;
	int best = -1;
	uint64_t w, bw = 0;
	double sc, bs = 0;

	for (i = 0; i < n; i++) {
		w = fmix64(key ^ fmix64(ids[i] + P3));
		if (weights == NULL) {
			if (best < 0 || w > bw) {
				best = (int)i;
				bw = w;
			}
			continue;
		}
		sc = (double)weights[i] /
		    -log(((double)(w >> 11) + 0.5) / 9007199254740992.0);
		if (best < 0 || sc > bs) {
			best = (int)i;
			bs = sc;
		}
	}
	return best;
}

/* ------------------------------------------------------------------ table */

#define NIL UINT32_MAX

struct ent {
	uint64_t hash;
	uint32_t up;
	int16_t replica;
	uint16_t ended;          /* 1: the last block of a recorded prompt, ever */
	uint32_t prev, next;     /* recency list when in use; next = free list */
};

struct sl_affinity {
	struct ent *e;
	uint32_t *idx;           /* entry index + 1; 0 = empty slot */
	uint32_t cap, used;
	uint32_t head, tail;     /* most / least recently recorded */
	uint32_t free;
	uint32_t mask;
	unsigned bits;
};

static uint32_t
home(const struct sl_affinity *a, uint64_t hash, uint32_t up)
{
	uint64_t x = (hash ^ ((uint64_t)up * P1)) * 0xBF58476D1CE4E5B9ULL;

	return (uint32_t)(x >> (64 - a->bits));
}

struct sl_affinity *
sl_affinity_new(uint32_t capacity)
{
	struct sl_affinity *a;
	uint32_t i;
	uint64_t slots = 2;
	unsigned bits = 1;

	if (capacity == 0 || capacity > SL_AFFINITY_MAX_CAPACITY)
		return NULL;
	while (slots < 2 * (uint64_t)capacity) {
		slots <<= 1;
		bits++;
	}
	if ((a = calloc(1, sizeof(*a))) == NULL)
		return NULL;
	a->e = calloc(capacity, sizeof(*a->e));
	a->idx = calloc((size_t)slots, sizeof(*a->idx));
	if (a->e == NULL || a->idx == NULL) {
		sl_affinity_free(a);
		return NULL;
	}
	a->cap = capacity;
	a->mask = (uint32_t)(slots - 1);
	a->bits = bits;
	a->head = a->tail = NIL;
	for (i = 0; i < capacity; i++)
		a->e[i].next = i + 1 < capacity ? i + 1 : NIL;
	a->free = 0;
	return a;
}

void
sl_affinity_free(struct sl_affinity *a)
{
	if (a == NULL)
		return;
	free(a->e);
	free(a->idx);
	free(a);
}

uint32_t
sl_affinity_size(const struct sl_affinity *a)
{
	return a->used;
}

uint32_t
sl_affinity_capacity(const struct sl_affinity *a)
{
	return a->cap;
}

/* The entry for (up, hash), or NIL with *slot the empty slot ending its probe. */
static uint32_t
find(const struct sl_affinity *a, uint32_t up, uint64_t hash, uint32_t *slot)
{
	uint32_t s = home(a, hash, up), i;

	while ((i = a->idx[s]) != 0) {
		if (a->e[i - 1].hash == hash && a->e[i - 1].up == up)
			return i - 1;
		s = (s + 1) & a->mask;
	}
	if (slot != NULL)
		*slot = s;
	return NIL;
}

static void
unlink_ent(struct sl_affinity *a, uint32_t i)
{
	struct ent *e = &a->e[i];

	if (e->prev != NIL)
		a->e[e->prev].next = e->next;
	else
		a->head = e->next;
	if (e->next != NIL)
		a->e[e->next].prev = e->prev;
	else
		a->tail = e->prev;
}

static void
push_head(struct sl_affinity *a, uint32_t i)
{
	a->e[i].prev = NIL;
	a->e[i].next = a->head;
	if (a->head != NIL)
		a->e[a->head].prev = i;
	a->head = i;
	if (a->tail == NIL)
		a->tail = i;
}

/* Remove entry i: its index slot (shifting the probe chain back), list, free list. */
static void
delete_ent(struct sl_affinity *a, uint32_t i)
{
	uint32_t s = home(a, a->e[i].hash, a->e[i].up), j, k;

	while (a->idx[s] != i + 1)
		s = (s + 1) & a->mask;
	for (j = s;;) {
		j = (j + 1) & a->mask;
		if (a->idx[j] == 0)
			break;
		k = home(a, a->e[a->idx[j] - 1].hash, a->e[a->idx[j] - 1].up);
		/* Leave idx[j] where it is if its home lies cyclically in (s, j]. */
		if (s <= j ? (s < k && k <= j) : (s < k || k <= j))
			continue;
		a->idx[s] = a->idx[j];
		s = j;
	}
	a->idx[s] = 0;
	unlink_ent(a, i);
	a->e[i].next = a->free;
	a->free = i;
	a->used--;
}

int
sl_affinity_lookup_end(struct sl_affinity *a, uint32_t upstream, const uint64_t *h,
    size_t n, size_t *matched, int *ended)
{
	uint32_t i;

	while (n > 0) {
		n--;
		if ((i = find(a, upstream, h[n], NULL)) != NIL) {
			*matched = n + 1;
			if (ended != NULL)
				*ended = a->e[i].ended;
			return a->e[i].replica;
		}
	}
	*matched = 0;
	if (ended != NULL)
		*ended = 0;
	return -1;
}

int
sl_affinity_lookup(struct sl_affinity *a, uint32_t upstream, const uint64_t *h, size_t n,
    size_t *matched)
{
	return sl_affinity_lookup_end(a, upstream, h, n, matched, NULL);
}

void
sl_affinity_record(struct sl_affinity *a, uint32_t upstream, const uint64_t *h, size_t n,
    int replica)
{
	uint32_t i, slot;

	size_t last = n - 1;

	/* Longest first, so the shorter prefixes end up the more recent. */
	while (n > 0) {
		n--;
		if ((i = find(a, upstream, h[n], &slot)) != NIL) {
			a->e[i].replica = (int16_t)replica;
			a->e[i].ended |= n == last;
			unlink_ent(a, i);
			push_head(a, i);
			continue;
		}
		if (a->used == a->cap) {
			delete_ent(a, a->tail);
			(void)find(a, upstream, h[n], &slot);   /* the shift may move the hole */
		}
		i = a->free;
		a->free = a->e[i].next;
		a->e[i].hash = h[n];
		a->e[i].up = upstream;
		a->e[i].replica = (int16_t)replica;
		a->e[i].ended = n == last;
		a->idx[slot] = i + 1;
		push_head(a, i);
		a->used++;
	}
}

static void
drop_if(struct sl_affinity *a, uint32_t upstream, int any_replica, int replica)
{
	uint32_t i = a->head, next;

	while (i != NIL) {
		next = a->e[i].next;
		if (a->e[i].up == upstream && (any_replica || a->e[i].replica == replica))
			delete_ent(a, i);
		i = next;
	}
}

void
sl_affinity_drop_replica(struct sl_affinity *a, uint32_t upstream, int replica)
{
	drop_if(a, upstream, 0, replica);
}

void
sl_affinity_drop_upstream(struct sl_affinity *a, uint32_t upstream)
{
	drop_if(a, upstream, 1, 0);
}
