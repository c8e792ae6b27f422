/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Which replica holds each stored response: see sl_stored.h for what the
 * table guarantees and how it is used.
 *
 * Where things live: one MAP_SHARED region of its own, made by the master
 * before forking (its size fixed for the master's life): a head (the
 * robust mutex, the use counter, the free list, the slab's high-water
 * mark), a record per pool (its max and ttl, read without the lock, its
 * LRU list and count), a slab of entries and the hash buckets. An entry
 * is (pool, two hashes of the id, the owner's identity, the use order
 * `tick` and the time of its last use), on its pool's LRU list (doubly
 * linked, head = most recently used) and on its bucket's chain (singly
 * linked). Buckets hold index + 1, so a page never written reads as empty
 * buckets.
 *
 * A crash: an entry's state is stored last when it is taken and first
 * when it is freed, and every list, chain and count is derived from the
 * states and ticks, so a process killed holding the lock leaves nothing
 * repair() cannot rebuild: the next pthread_mutex_lock returns
 * EOWNERDEAD, and that process rebuilds before going on.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "sl_stored.h"
#include "sl_util.h"

#define ST_CACHELINE 64
#define NIL (-1)

enum { E_FREE = 0, E_USED };

struct st_head {
	pthread_mutex_t lock;
	_Atomic uint64_t repairs;
	uint64_t tick;               /* last use order handed out */
	int32_t free_head;
	uint32_t hwm;                /* entries ever handed out */
	uint32_t used;               /* entries in use, all pools */
};

struct st_pool {
	alignas(ST_CACHELINE) _Atomic uint32_t max;   /* 0: off */
	_Atomic uint64_t ttl_ms;
	int32_t head, tail;          /* LRU: head most recently used */
	uint32_t count;
};

struct st_entry {
	uint64_t h1, h2;             /* the id's hashes */
	uint64_t owner;              /* the replica's identity */
	uint64_t tick;               /* use order: higher is more recent */
	int64_t used_ms;             /* last learnt or looked up */
	int32_t prev, next;          /* the pool's LRU list */
	int32_t chain;               /* the bucket's chain */
	int32_t pool;
	_Atomic int32_t state;
	int32_t pad;
};
_Static_assert(sizeof(struct st_entry) == 64, "an entry's bytes, as documented");

struct sl_stored {
	char *base;
	size_t len;
	size_t npools, cap;
	uint32_t mask;               /* buckets - 1 */
	struct st_head *h;
	struct st_pool *pools;
	struct st_entry *e;
	int32_t *buckets;            /* index + 1; 0: empty */
};

static size_t
round_up(size_t n, size_t a)
{
	return (n + a - 1) / a * a;
}

static void
pools_init(struct sl_stored *t)
{
	size_t i;

	for (i = 0; i < t->npools; i++) {
		t->pools[i].head = t->pools[i].tail = NIL;
		t->pools[i].count = 0;
	}
}

struct sl_stored *
sl_stored_create(size_t npools, size_t cap)
{
	size_t off_pools, off_e, off_b, len, nb;
	pthread_mutexattr_t ma;
	struct sl_stored *t;
	char *base;
	int rc;

	if (npools == 0 || npools > (1u << 20) || cap == 0 ||
	    cap > SL_STORED_CAP) {
		errno = EINVAL;
		return NULL;
	}
	for (nb = 1; nb < cap; nb <<= 1)
		;
	off_pools = round_up(sizeof(struct st_head), ST_CACHELINE);
	off_e = round_up(off_pools + npools * sizeof(struct st_pool), 4096);
	off_b = round_up(off_e + cap * sizeof(struct st_entry), 4096);
	len = off_b + nb * sizeof(int32_t);
	if ((t = calloc(1, sizeof(*t))) == NULL)
		return NULL;
	/* Reserved, not committed: a page costs once an entry on it is used. */
	base = mmap(NULL, len, PROT_READ | PROT_WRITE,
	    MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (base == MAP_FAILED) {
		free(t);
		return NULL;
	}
	t->base = base;
	t->len = len;
	t->npools = npools;
	t->cap = cap;
	t->mask = (uint32_t)(nb - 1);
	t->h = (struct st_head *)(void *)base;
	t->pools = (struct st_pool *)(void *)(base + off_pools);
	t->e = (struct st_entry *)(void *)(base + off_e);
	t->buckets = (int32_t *)(void *)(base + off_b);
	if ((rc = pthread_mutexattr_init(&ma)) == 0) {
		rc = pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
		if (rc == 0)
			rc = pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
		if (rc == 0)
			rc = pthread_mutex_init(&t->h->lock, &ma);
		pthread_mutexattr_destroy(&ma);
	}
	if (rc != 0) {
		sl_stored_destroy(t);
		errno = rc;
		return NULL;
	}
	t->h->free_head = NIL;
	pools_init(t);
	return t;
}

void
sl_stored_destroy(struct sl_stored *t)
{
	if (t == NULL)
		return;
	munmap(t->base, t->len);
	free(t);
}

/* ---- hashing --------------------------------------------------------- */

static uint64_t
mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xBF58476D1CE4E5B9ULL;
	x ^= x >> 27;
	x *= 0x94D049BB133111EBULL;
	return x ^ (x >> 31);
}

/* Two hashes of id: FNV-1a from two offsets, each finished by splitmix64. */
static void
id_hash(const char *id, size_t len, uint64_t *h1, uint64_t *h2)
{
	*h1 = mix64(sl_fnv1a(SL_FNV_OFFSET, id, len) ^ len);
	*h2 = mix64(sl_fnv1a(SL_FNV_OFFSET ^ 0x6A09E667F3BCC908ULL, id, len) +
	    0x9E3779B97F4A7C15ULL);
}

static uint32_t
bucket_of(const struct sl_stored *t, size_t pool, uint64_t h1)
{
	return (uint32_t)(mix64(h1 ^ ((uint64_t)pool << 40)) & t->mask);
}

/* ---- lists and chains (under the lock) ------------------------------- */

static int32_t
find(const struct sl_stored *t, size_t pool, uint64_t h1, uint64_t h2)
{
	int32_t i = t->buckets[bucket_of(t, pool, h1)] - 1;
	size_t n = 0;

	for (; i != NIL && n++ <= t->cap; i = t->e[i].chain)
		if (t->e[i].h1 == h1 && t->e[i].h2 == h2 &&
		    t->e[i].pool == (int32_t)pool)
			return i;
	return NIL;
}

static void
chain_add(struct sl_stored *t, int32_t i)
{
	int32_t *b = &t->buckets[bucket_of(t, (size_t)t->e[i].pool, t->e[i].h1)];

	t->e[i].chain = *b - 1;
	*b = i + 1;
}

static void
chain_remove(struct sl_stored *t, int32_t i)
{
	int32_t *b = &t->buckets[bucket_of(t, (size_t)t->e[i].pool, t->e[i].h1)];
	int32_t j = *b - 1;

	if (j == i) {
		*b = t->e[i].chain + 1;
		return;
	}
	for (; j != NIL; j = t->e[j].chain)
		if (t->e[j].chain == i) {
			t->e[j].chain = t->e[i].chain;
			return;
		}
}

static void
lru_unlink(struct sl_stored *t, int32_t i)
{
	struct st_entry *e = &t->e[i];
	struct st_pool *p = &t->pools[e->pool];

	if (e->prev != NIL)
		t->e[e->prev].next = e->next;
	else
		p->head = e->next;
	if (e->next != NIL)
		t->e[e->next].prev = e->prev;
	else
		p->tail = e->prev;
	e->prev = e->next = NIL;
}

static void
lru_push(struct sl_stored *t, int32_t i)
{
	struct st_entry *e = &t->e[i];
	struct st_pool *p = &t->pools[e->pool];

	e->prev = NIL;
	e->next = p->head;
	if (p->head != NIL)
		t->e[p->head].prev = i;
	else
		p->tail = i;
	p->head = i;
}

/* i becomes its pool's most recently used, at now_ms. */
static void
touch(struct sl_stored *t, int32_t i, int64_t now_ms)
{
	t->e[i].tick = ++t->h->tick;
	t->e[i].used_ms = now_ms;
	if (t->pools[t->e[i].pool].head != i) {
		lru_unlink(t, i);
		lru_push(t, i);
	}
}

/* Free entry i: its state first (a crash after it leaves a freed entry). */
static void
evict(struct sl_stored *t, int32_t i)
{
	struct st_entry *e = &t->e[i];

	atomic_store(&e->state, E_FREE);
	chain_remove(t, i);
	lru_unlink(t, i);
	t->pools[e->pool].count--;
	t->h->used--;
	e->next = t->h->free_head;
	t->h->free_head = i;
}

static int
expired(const struct sl_stored *t, const struct st_entry *e, int64_t now_ms)
{
	uint64_t ttl = atomic_load_explicit(&t->pools[e->pool].ttl_ms,
	    memory_order_relaxed);

	return ttl > 0 && now_ms - e->used_ms > (int64_t)ttl;
}

/* Drop the pool's expired ids, oldest first, a few at a time. */
static void
expire_some(struct sl_stored *t, size_t pool, int64_t now_ms)
{
	int32_t i;
	int n;

	for (n = 0; n < 8 && (i = t->pools[pool].tail) != NIL &&
	    expired(t, &t->e[i], now_ms); n++)
		evict(t, i);
}

/* A free entry: the free list, the slab's unused end, or NIL. */
static int32_t
take_free(struct sl_stored *t)
{
	int32_t i = t->h->free_head;

	if (i != NIL) {
		t->h->free_head = t->e[i].next;
		return i;
	}
	if (t->h->hwm < t->cap)
		return (int32_t)t->h->hwm++;
	return NIL;
}

/* The slab is full: the least recently used id of any pool goes. */
static void
evict_oldest(struct sl_stored *t)
{
	size_t pl;
	int32_t i, best = NIL;

	for (pl = 0; pl < t->npools; pl++)
		if ((i = t->pools[pl].tail) != NIL &&
		    (best == NIL || t->e[i].tick < t->e[best].tick))
			best = i;
	if (best != NIL)
		evict(t, best);
}

/* ---- the lock ---------------------------------------------------------- */

/* qsort has no argument: the entries being sorted, under the lock. */
static const struct st_entry *sort_e;

static int
cmp_tick(const void *a, const void *b)
{
	uint64_t x = sort_e[*(const int32_t *)a].tick;
	uint64_t y = sort_e[*(const int32_t *)b].tick;

	return x < y ? -1 : x > y;
}

/*
 * Rebuild every list, chain and count from the entries' states, in use
 * order (their ticks): after a process died holding the lock.
 */
static void
repair(struct sl_stored *t)
{
	uint32_t i, hwm = t->h->hwm > t->cap ? (uint32_t)t->cap : t->h->hwm;
	int32_t *order = calloc(hwm ? hwm : 1, sizeof(*order));
	size_t n = 0, k;
	uint64_t top = 0;

	t->h->hwm = hwm;
	pools_init(t);
	memset(t->buckets, 0, ((size_t)t->mask + 1) * sizeof(int32_t));
	t->h->free_head = NIL;
	t->h->used = 0;
	for (i = hwm; i-- > 0;) {
		struct st_entry *e = &t->e[i];

		if (atomic_load(&e->state) != E_USED || e->pool < 0 ||
		    (size_t)e->pool >= t->npools) {
			atomic_store(&e->state, E_FREE);
			e->next = t->h->free_head;
			t->h->free_head = (int32_t)i;
			continue;
		}
		if (e->tick > top)
			top = e->tick;
		if (order != NULL)
			order[n++] = (int32_t)i;
		else {
			/* Out of memory: all kept, the order by index. */
			lru_push(t, (int32_t)i);
			chain_add(t, (int32_t)i);
			t->pools[e->pool].count++;
			t->h->used++;
		}
	}
	if (order != NULL) {
		sort_e = t->e;
		qsort(order, n, sizeof(*order), cmp_tick);
		for (k = 0; k < n; k++) {
			lru_push(t, order[k]);   /* the newest ends at the head */
			chain_add(t, order[k]);
			t->pools[t->e[order[k]].pool].count++;
			t->h->used++;
		}
	}
	if (top > t->h->tick)
		t->h->tick = top;
	free(order);
}

static void
st_lock(struct sl_stored *t)
{
	if (pthread_mutex_lock(&t->h->lock) == EOWNERDEAD) {
		repair(t);
		atomic_fetch_add(&t->h->repairs, 1);
		pthread_mutex_consistent(&t->h->lock);
	}
}

static void
st_unlock(struct sl_stored *t)
{
	pthread_mutex_unlock(&t->h->lock);
}

/* ---- settings ------------------------------------------------------------ */

void
sl_stored_set_pool(struct sl_stored *t, size_t pool, uint32_t max,
    uint64_t ttl_ms)
{
	struct st_pool *p;

	if (t == NULL || pool >= t->npools)
		return;
	p = &t->pools[pool];
	if (max > SL_STORED_MAX)
		max = SL_STORED_MAX;
	st_lock(t);
	atomic_store(&p->max, max);
	atomic_store(&p->ttl_ms, ttl_ms);
	while (p->count > max && p->tail != NIL)
		evict(t, p->tail);
	st_unlock(t);
}

void
sl_stored_reset_pool(struct sl_stored *t, size_t pool)
{
	struct st_pool *p;

	if (t == NULL || pool >= t->npools)
		return;
	p = &t->pools[pool];
	st_lock(t);
	atomic_store(&p->max, 0);
	while (p->tail != NIL)
		evict(t, p->tail);
	st_unlock(t);
}

int
sl_stored_on(const struct sl_stored *t, size_t pool)
{
	if (t == NULL || pool >= t->npools)
		return 0;
	return atomic_load_explicit(&t->pools[pool].max,
	    memory_order_relaxed) > 0;
}

/* ---- learning and finding ------------------------------------------------ */

void
sl_stored_put(struct sl_stored *t, size_t pool, const char *id, size_t len,
    uint64_t owner, int64_t now_ms)
{
	struct st_pool *p;
	struct st_entry *e;
	uint64_t h1, h2;
	uint32_t max;
	int32_t i;

	if (!sl_stored_on(t, pool) || len == 0 || len > SL_STORED_ID_MAX)
		return;
	p = &t->pools[pool];
	id_hash(id, len, &h1, &h2);
	st_lock(t);
	expire_some(t, pool, now_ms);
	if ((i = find(t, pool, h1, h2)) != NIL) {
		t->e[i].owner = owner;
		touch(t, i, now_ms);
		st_unlock(t);
		return;
	}
	if ((max = atomic_load(&p->max)) == 0) {
		st_unlock(t);   /* turned off meanwhile */
		return;
	}
	while (p->count >= max && p->tail != NIL)
		evict(t, p->tail);
	if ((i = take_free(t)) == NIL) {
		evict_oldest(t);
		if ((i = take_free(t)) == NIL) {
			st_unlock(t);
			return;
		}
	}
	e = &t->e[i];
	e->h1 = h1;
	e->h2 = h2;
	e->owner = owner;
	e->pool = (int32_t)pool;
	e->tick = ++t->h->tick;
	e->used_ms = now_ms;
	chain_add(t, i);
	lru_push(t, i);
	p->count++;
	t->h->used++;
	atomic_store(&e->state, E_USED);   /* last: see repair() */
	st_unlock(t);
}

int
sl_stored_get(struct sl_stored *t, size_t pool, const char *id, size_t len,
    int64_t now_ms, uint64_t *owner)
{
	uint64_t h1, h2;
	int32_t i;
	int rc = -1;

	if (!sl_stored_on(t, pool) || len == 0 || len > SL_STORED_ID_MAX)
		return -1;
	id_hash(id, len, &h1, &h2);
	st_lock(t);
	if ((i = find(t, pool, h1, h2)) != NIL) {
		if (expired(t, &t->e[i], now_ms))
			evict(t, i);
		else {
			*owner = t->e[i].owner;
			touch(t, i, now_ms);
			rc = 0;
		}
	}
	expire_some(t, pool, now_ms);
	st_unlock(t);
	return rc;
}

size_t
sl_stored_count(struct sl_stored *t, size_t pool)
{
	size_t n;

	if (t == NULL || pool >= t->npools)
		return 0;
	st_lock(t);
	n = t->pools[pool].count;
	st_unlock(t);
	return n;
}

size_t
sl_stored_walk(struct sl_stored *t, size_t pool, uint64_t *owners, size_t max)
{
	size_t n = 0;
	int32_t i;

	if (t == NULL || pool >= t->npools)
		return 0;
	st_lock(t);
	for (i = t->pools[pool].head; i != NIL && n <= t->cap; i = t->e[i].next) {
		if (owners != NULL && n < max)
			owners[n] = t->e[i].owner;
		n++;
	}
	st_unlock(t);
	return n;
}

uint64_t
sl_stored_repairs(const struct sl_stored *t)
{
	return atomic_load(&((struct sl_stored *)t)->h->repairs);
}

void
sl_stored_lock_for_test(struct sl_stored *t)
{
	st_lock(t);
}

#define BROKEN(...) do { snprintf(why, whylen, __VA_ARGS__); goto out; } while (0)

int
sl_stored_check(struct sl_stored *t, char *why, size_t whylen)
{
	size_t pl, nfree = 0, nused = 0, k;
	int32_t i, prev;
	uint64_t last;
	char dummy[1];
	int rc = -1;

	if (why == NULL || whylen == 0) {
		why = dummy;
		whylen = sizeof(dummy);
	}
	st_lock(t);
	for (pl = 0; pl < t->npools; pl++) {
		struct st_pool *p = &t->pools[pl];
		uint32_t cnt = 0;

		prev = NIL;
		last = UINT64_MAX;
		for (i = p->head; i != NIL; prev = i, i = t->e[i].next) {
			struct st_entry *e = &t->e[i];

			if (atomic_load(&e->state) != E_USED ||
			    e->pool != (int32_t)pl || e->prev != prev)
				BROKEN("pool %zu: entry %d misplaced", pl, (int)i);
			if (e->tick >= last)
				BROKEN("pool %zu: list out of use order", pl);
			last = e->tick;
			if (find(t, pl, e->h1, e->h2) != i)
				BROKEN("pool %zu: entry %d not in its chain", pl,
				    (int)i);
			if (++cnt > t->cap)
				BROKEN("pool %zu: list loops", pl);
		}
		if (p->tail != prev)
			BROKEN("pool %zu: tail", pl);
		if (cnt != p->count)
			BROKEN("pool %zu: %u listed, count says %u", pl,
			    (unsigned)cnt, (unsigned)p->count);
		if (cnt > atomic_load(&p->max))
			BROKEN("pool %zu: %u over max %u", pl, (unsigned)cnt,
			    (unsigned)atomic_load(&p->max));
		nused += cnt;
	}
	for (i = t->h->free_head, k = 0; i != NIL && k <= t->cap;
	    i = t->e[i].next, k++) {
		if (atomic_load(&t->e[i].state) != E_FREE)
			BROKEN("entry %d on the free list is used", (int)i);
		nfree++;
	}
	if (nused != t->h->used)
		BROKEN("%zu listed, used says %u", nused, (unsigned)t->h->used);
	if (nused + nfree != t->h->hwm)
		BROKEN("%zu used + %zu free != %u handed out", nused, nfree,
		    (unsigned)t->h->hwm);
	rc = 0;
	why[0] = '\0';
out:
	st_unlock(t);
	return rc;
}

/* ---- the id of an answer ----------------------------------------------- */

void
sl_stored_scan_init(struct sl_stored_scan *s, int sse)
{
	memset(s, 0, sizeof(*s));
	s->sse = sse != 0;
}

#define KEY_MAX sizeof(((struct sl_stored_scan *)0)->key)
#define KEY_LONG 0xff

static int
key_is(const struct sl_stored_scan *s, const char *k)
{
	size_t n = strlen(k);

	return s->klen == n && memcmp(s->key, k, n) == 0;
}

/* The JSON state back to a document's start (a new SSE event). */
static void
json_reset(struct sl_stored_scan *s)
{
	s->in_str = s->esc = s->want = s->is_key = s->capture = 0;
	s->klen = 0;
	s->depth = s->match = 0;
	s->idlen = 0;
}

static int
is_array(const struct sl_stored_scan *s)
{
	return s->depth >= 1 && s->depth <= 4 && s->arr[s->depth - 1];
}

/*
 * One byte of JSON text: 1 when the id just ended. The id is a string
 * value at depth 1 under key "id" (a JSON body), or at depth 2 under
 * "id" inside the depth-1 member "response" (an event's data).
 */
static int
json_byte(struct sl_stored_scan *s, char c)
{
	if (s->in_str) {
		if (s->esc) {
			s->esc = 0;
			return 0;
		}
		if (c == '\\') {
			s->esc = 1;
			if (s->capture)
				s->done = 1;   /* an escaped id: not learnt */
			if (s->is_key)
				s->klen = KEY_LONG;
			return 0;
		}
		if (c == '"') {
			s->in_str = 0;
			if (s->capture) {
				s->capture = 0;
				s->id[s->idlen] = '\0';
				return s->idlen > 0;
			}
			return 0;
		}
		if (s->is_key && s->klen != KEY_LONG) {
			s->key[s->klen] = c;
			s->klen = s->klen + 1u < KEY_MAX ?
			    (uint8_t)(s->klen + 1) : KEY_LONG;
		}
		if (s->capture) {
			if (s->idlen >= SL_STORED_ID_MAX)
				s->done = 1;
			else
				s->id[s->idlen++] = c;
		}
		return 0;
	}
	switch (c) {
	case '"':
		s->in_str = 1;
		s->is_key = s->depth >= 1 && !is_array(s) && s->want;
		if (s->is_key)
			s->klen = 0;
		else
			s->capture = !is_array(s) && key_is(s, "id") &&
			    ((!s->sse && s->depth == 1) ||
			    (s->sse && s->depth == 2 && s->match == 2));
		s->idlen = 0;
		break;
	case ':':
		s->want = 0;
		break;
	case ',':
		s->want = !is_array(s);
		break;
	case '{':
	case '[':
		if (c == '{' && s->sse && s->depth == 1 && !is_array(s) &&
		    key_is(s, "response"))
			s->match = 2;
		s->depth++;
		if (s->depth <= 4)
			s->arr[s->depth - 1] = c == '[';
		s->want = c == '{';
		break;
	case '}':
	case ']':
		if (s->depth > 0)
			s->depth--;
		if (s->match > s->depth)
			s->match = 0;
		s->want = 0;
		break;
	default:
		break;
	}
	return 0;
}

/* One byte of an event stream: data values go to json_byte. */
static int
sse_byte(struct sl_stored_scan *s, char c)
{
	if (c == '\r')
		return 0;
	switch (s->line) {
	case 0:   /* a line starts */
		if (c == '\n') {
			json_reset(s);   /* a blank line: the event ended */
			return 0;
		}
		s->line = c == 'd' ? 1 : 3;
		s->fpos = 1;
		return 0;
	case 1:   /* "data:"? */
		if (c == '\n')
			s->line = 0;
		else if (s->fpos < 4 && c == "data"[s->fpos])
			s->fpos++;
		else if (s->fpos == 4 && c == ':') {
			s->line = 2;
			s->lead = 0;
		} else
			s->line = 3;
		return 0;
	case 2:   /* a data value: JSON text, lines joined by '\n' */
		if (c == '\n') {
			s->line = 0;
			return json_byte(s, ' ');
		}
		if (!s->lead) {
			s->lead = 1;
			if (c == ' ')
				return 0;
		}
		return json_byte(s, c);
	default:  /* another field, a comment */
		if (c == '\n')
			s->line = 0;
		return 0;
	}
}

int
sl_stored_scan_feed(struct sl_stored_scan *s, const char *p, size_t n)
{
	size_t i;

	for (i = 0; i < n && !s->done; i++) {
		if (s->seen++ >= SL_STORED_SCAN_MAX) {
			s->done = 1;
			break;
		}
		if (s->sse ? sse_byte(s, p[i]) : json_byte(s, p[i])) {
			s->done = 1;
			return 1;
		}
	}
	return 0;
}
