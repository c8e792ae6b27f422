/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The fair queue of the upstream pools: see sl_queue.h for what it
 * guarantees and how it is used.
 *
 * A slot handed to a waiter, between two workers:
 *
 *   releasing worker A (slot of replica R, pool p)   waiting worker B
 *   ------------------------------------------------ -------------------
 *   sl_queue_waiting(p) == 0 ? plain release (one atomic load)
 *   else sl_queue_offer(p, R):
 *     lock; best waiter W of p (band, counter, age);
 *     move R's slot from A's row to the queue's row
 *     (in-flight unchanged: never released, never
 *     seen free by anyone); W := GRANTED(R), on B's
 *     list; unlock; eventfd of row B += 1   ------->  ev_io readable:
 *                                                    sl_queue_collect(B):
 *                                                    slot moved queue row
 *                                                    -> row B, entry freed,
 *                                                    the request starts on R
 *
 * Where things live: a MAP_SHARED region of its own, made by the master
 * before forking (its size fixed for the master's life, like sl_shm's):
 * one process-shared robust mutex over the whole queue; per pool its
 * settings, the count of waiters (an atomic on its own cache line: the
 * only thing the path without a queue reads), the list of tenants with
 * waiters and outcome counters; per pool and tenant the service counter,
 * the count of waiters and their FIFO; per tenant weight and priority
 * (the master publishes them on start and reload: they apply at once to
 * waiters); a slab of entries (tenant, pool, worker row, enqueue time and
 * order, state, the granted slot, a generation so that a stale handle is
 * refused); per worker row the list of grants not yet collected and a
 * wake flag. Each row has an eventfd made by the master before it forks
 * the first workers of a config with a queue (sl_queue_enable_wake): a
 * grant writes it once per batch, the worker watches it with ev_io. The
 * queue row's held cells in sl_shm are written only under the lock.
 *
 * Everything below the lock is plain data except what is read without
 * it (a pool's waiter count and settings, counters, weights): those are
 * atomics. An entry's state is written last when it changes, and every
 * list is derived from the entries' states, so a process killed while
 * holding the lock leaves nothing repair() cannot rebuild.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sl_queue.h"

#define Q_CACHELINE 64
#define NIL (-1)

enum { E_FREE = 0, E_WAITING, E_GRANTED };

struct q_head {
	pthread_mutex_t lock;
	_Atomic uint64_t repairs;
	int32_t free_head;
};

struct q_pool {
	alignas(Q_CACHELINE) _Atomic int32_t nwait;   /* WAITING entries */
	_Atomic int32_t max;                           /* 0: no queue */
	_Atomic int32_t timeout_ms;                    /* <= 0: none */
	_Atomic int32_t fairness;
	int32_t active;               /* first tenant with waiters, NIL */
	int32_t npinned;              /* WAITING entries that want one slot */
	uint64_t seq;                 /* enqueue order */
	uint64_t vref;                /* counter of the last dispatched tenant */
	_Atomic uint64_t out[SL_QUEUE_O_MAX];
	_Atomic uint64_t wait_ms;
	_Atomic uint64_t wait_hist[SL_HIST_BUCKETS + 1];   /* dispatched */
};

/* One pool and tenant. */
struct q_cell {
	_Atomic uint64_t service;     /* milli-tokens / weight */
	_Atomic int32_t nwait;
	int32_t head, tail;           /* FIFO of WAITING entries */
	int32_t next, prev;           /* the pool's tenants with waiters */
};

struct q_tenant {
	_Atomic int32_t weight;       /* 0 read as 1 */
	_Atomic int32_t priority;
};

struct q_entry {
	int32_t next, prev;           /* cell FIFO, row's grants or free list */
	int32_t pool, tenant, row;
	_Atomic int32_t state;
	uint32_t gen;
	int64_t enq_ms;
	uint64_t seq;
	int64_t slot;                 /* GRANTED: replica index; -1 closed */
	int64_t want;                 /* the only slot it takes; -1: any */
	uint64_t cost;
};

struct q_row {
	alignas(Q_CACHELINE) _Atomic int32_t wake;     /* grants to collect */
	int32_t head, tail;           /* GRANTED entries of the row */
};

struct sl_queue {
	char *base;
	size_t len;
	struct sl_shm *shm;
	size_t npools, ntenants, nentries, nrows;
	struct q_head *h;
	struct q_pool *pools;
	struct q_cell *cells;
	uint64_t *cell_pages;         /* [bits]: pages of cells written */
	struct q_tenant *tenants;
	struct q_entry *e;
	struct q_row *rows;
	int *fds;                     /* [nrows] eventfd, process-local */
	unsigned char *to_wake;       /* [nrows] this process, under the lock */
	int any_wake;
};

static size_t
round_up(size_t n, size_t a)
{
	return (n + a - 1) / a * a;
}

const char *
sl_queue_outcome_label(enum sl_queue_outcome o)
{
	static const char *const names[SL_QUEUE_O_MAX] = {
		"dispatched", "timeout", "full", "gone", "shed"
	};

	return o < SL_QUEUE_O_MAX ? names[o] : "other";
}

/*
 * The cells of every pool and shared index are reserved, not committed:
 * a page of them is written (its links set to NIL) the first time a
 * holder of the lock needs one of its cells, and marked in cell_pages.
 * Until then its cells read as zero, which is right for what is read
 * without the lock (service, nwait); the links are read only through
 * cell(), under the lock.
 */
#define CELLS_PER_PAGE (4096 / sizeof(struct q_cell))

static void
cells_init(struct q_cell *c, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		c[i].head = c[i].tail = NIL;
		c[i].next = c[i].prev = NIL;
	}
}

/* A cell for its counters only (service, nwait): no lock needed. */
static struct q_cell *
cell_ro(const struct sl_queue *q, size_t pool, size_t tenant)
{
	return &q->cells[pool * q->ntenants + tenant];
}

/* A cell, its links too: under the lock. */
static struct q_cell *
cell(const struct sl_queue *q, size_t pool, size_t tenant)
{
	size_t i = pool * q->ntenants + tenant, pg = i / CELLS_PER_PAGE;
	uint64_t bit = UINT64_C(1) << (pg % 64);

	if (!(q->cell_pages[pg / 64] & bit)) {
		size_t first = pg * CELLS_PER_PAGE, n = CELLS_PER_PAGE;

		if (first + n > q->npools * q->ntenants)
			n = q->npools * q->ntenants - first;
		cells_init(&q->cells[first], n);
		q->cell_pages[pg / 64] |= bit;
	}
	return &q->cells[i];
}

/* Whether the page of cell i was ever written (under the lock). */
static int
cell_page_used(const struct sl_queue *q, size_t i)
{
	size_t pg = i / CELLS_PER_PAGE;

	return (q->cell_pages[pg / 64] >> (pg % 64)) & 1;
}

static void
reset_lists(struct sl_queue *q)
{
	size_t i;

	q->h->free_head = NIL;
	for (i = 0; i < q->npools; i++) {
		q->pools[i].active = NIL;
		q->pools[i].npinned = 0;
		atomic_store(&q->pools[i].nwait, 0);
	}
	for (i = 0; i < q->npools * q->ntenants; i += CELLS_PER_PAGE)
		if (cell_page_used(q, i)) {
			size_t j, n = CELLS_PER_PAGE;

			if (i + n > q->npools * q->ntenants)
				n = q->npools * q->ntenants - i;
			cells_init(&q->cells[i], n);
			for (j = i; j < i + n; j++)
				atomic_store(&q->cells[j].nwait, 0);
		}
	for (i = 0; i < q->nrows; i++)
		q->rows[i].head = q->rows[i].tail = NIL;
}

static void
free_push(struct sl_queue *q, int32_t i)
{
	struct q_entry *e = &q->e[i];

	atomic_store(&e->state, E_FREE);
	e->prev = NIL;
	e->next = q->h->free_head;
	q->h->free_head = i;
}

struct sl_queue *
sl_queue_create(struct sl_shm *shm, size_t npools, size_t ntenants,
    size_t nentries, size_t nrows)
{
	size_t off_pools, off_cells, off_tenants, off_e, off_rows, off_pages;
	size_t len, i;
	pthread_mutexattr_t ma;
	struct sl_queue *q;
	char *base;
	int rc;

	if (shm == NULL || npools == 0 || ntenants == 0 || nentries == 0 ||
	    nrows == 0 || nentries > INT32_MAX || ntenants > SL_SHM_MAX_INDICES ||
	    npools > 4096 || nrows > sl_shm_max_rows(shm) ||
	    ntenants > sl_shm_max_tenants(shm)) {
		errno = EINVAL;
		return NULL;
	}
	off_pools = round_up(sizeof(struct q_head), Q_CACHELINE);
	off_cells = round_up(off_pools + npools * sizeof(struct q_pool),
	    Q_CACHELINE);
	off_tenants = round_up(off_cells + npools * ntenants *
	    sizeof(struct q_cell), Q_CACHELINE);
	off_e = round_up(off_tenants + ntenants * sizeof(struct q_tenant),
	    Q_CACHELINE);
	off_rows = round_up(off_e + nentries * sizeof(struct q_entry),
	    Q_CACHELINE);
	off_pages = round_up(off_rows + nrows * sizeof(struct q_row),
	    Q_CACHELINE);
	len = off_pages + ((npools * ntenants / CELLS_PER_PAGE + 1) / 64 + 1) *
	    sizeof(uint64_t);

	if ((q = calloc(1, sizeof(*q))) == NULL)
		return NULL;
	q->fds = malloc(nrows * sizeof(*q->fds));
	q->to_wake = calloc(nrows, 1);
	if (q->fds == NULL || q->to_wake == NULL)
		goto fail;
	for (i = 0; i < nrows; i++)
		q->fds[i] = -1;
	/* Reserved, not committed: see cell(). */
	base = mmap(NULL, len, PROT_READ | PROT_WRITE,
	    MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (base == MAP_FAILED)
		goto fail;
	q->base = base;
	q->len = len;
	q->shm = shm;
	q->npools = npools;
	q->ntenants = ntenants;
	q->nentries = nentries;
	q->nrows = nrows;
	q->h = (struct q_head *)(void *)base;
	q->pools = (struct q_pool *)(void *)(base + off_pools);
	q->cells = (struct q_cell *)(void *)(base + off_cells);
	q->tenants = (struct q_tenant *)(void *)(base + off_tenants);
	q->e = (struct q_entry *)(void *)(base + off_e);
	q->rows = (struct q_row *)(void *)(base + off_rows);
	q->cell_pages = (uint64_t *)(void *)(base + off_pages);

	if (pthread_mutexattr_init(&ma) != 0)
		goto fail;
	rc = pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	if (rc == 0)
		rc = pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
	if (rc == 0)
		rc = pthread_mutex_init(&q->h->lock, &ma);
	pthread_mutexattr_destroy(&ma);
	if (rc != 0) {
		errno = rc;
		goto fail;
	}
	reset_lists(q);
	for (i = nentries; i-- > 0;)
		free_push(q, (int32_t)i);
	/* Weights start at 0, read as 1: no page written before it is used. */
	return q;
fail:
	sl_queue_destroy(q);
	return NULL;
}

void
sl_queue_destroy(struct sl_queue *q)
{
	size_t i;

	if (q == NULL)
		return;
	for (i = 0; q->fds != NULL && i < q->nrows; i++)
		if (q->fds[i] >= 0)
			close(q->fds[i]);
	if (q->base != NULL)
		munmap(q->base, q->len);
	free(q->fds);
	free(q->to_wake);
	free(q);
}

int
sl_queue_enable_wake(struct sl_queue *q)
{
	size_t i;

	for (i = 0; i < q->nrows; i++)
		if (q->fds[i] < 0 &&
		    (q->fds[i] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) == -1)
			return -1;
	return 0;
}

int
sl_queue_wake_fd(const struct sl_queue *q, size_t row)
{
	return row < q->nrows ? q->fds[row] : -1;
}

/* ---- lists (under the lock) -------------------------------------------- */

static uint64_t
service(const struct sl_queue *q, size_t pool, size_t tenant)
{
	return atomic_load_explicit(&cell_ro(q, pool, tenant)->service,
	    memory_order_relaxed);
}

/*
 * VTC's lift on arrival: a tenant that starts waiting takes the lowest
 * counter among the waiting tenants (or, nobody waiting, the counter of
 * the last one dispatched) if its own is lower: idle time banks nothing.
 */
static void
lift(struct sl_queue *q, size_t pool, size_t tenant)
{
	struct q_pool *p = &q->pools[pool];
	uint64_t ref = p->vref, v;
	int32_t t;
	int any = 0;

	for (t = p->active; t != NIL; t = cell(q, pool, (size_t)t)->next) {
		v = service(q, pool, (size_t)t);
		if (!any || v < ref)
			ref = v;
		any = 1;
	}
	/* A charge may race this (lock-free); it only ever adds. */
	v = service(q, pool, tenant);
	while (v < ref && !atomic_compare_exchange_weak(
	    &cell_ro(q, pool, tenant)->service, &v, ref))
		;
}

/* Append a WAITING entry to its tenant's FIFO (by seq: repair may insert). */
static void
cell_push(struct sl_queue *q, int32_t i, int do_lift)
{
	struct q_entry *e = &q->e[i];
	struct q_pool *p = &q->pools[e->pool];
	struct q_cell *c = cell(q, (size_t)e->pool, (size_t)e->tenant);
	int32_t at = c->tail;

	if (atomic_load(&c->nwait) == 0) {
		if (do_lift)
			lift(q, (size_t)e->pool, (size_t)e->tenant);
		c->prev = NIL;
		c->next = p->active;
		if (p->active != NIL)
			cell(q, (size_t)e->pool, (size_t)p->active)->prev =
			    e->tenant;
		p->active = e->tenant;
	}
	while (at != NIL && q->e[at].seq > e->seq)
		at = q->e[at].prev;
	e->prev = at;
	e->next = at == NIL ? c->head : q->e[at].next;
	if (e->next != NIL)
		q->e[e->next].prev = i;
	else
		c->tail = i;
	if (at != NIL)
		q->e[at].next = i;
	else
		c->head = i;
	atomic_fetch_add(&c->nwait, 1);
	atomic_fetch_add(&p->nwait, 1);
	if (e->want >= 0)
		p->npinned++;
}

static void
cell_remove(struct sl_queue *q, int32_t i)
{
	struct q_entry *e = &q->e[i];
	struct q_pool *p = &q->pools[e->pool];
	struct q_cell *c = cell(q, (size_t)e->pool, (size_t)e->tenant);

	if (e->prev != NIL)
		q->e[e->prev].next = e->next;
	else
		c->head = e->next;
	if (e->next != NIL)
		q->e[e->next].prev = e->prev;
	else
		c->tail = e->prev;
	e->next = e->prev = NIL;
	atomic_fetch_sub(&p->nwait, 1);
	if (e->want >= 0)
		p->npinned--;
	if (atomic_fetch_sub(&c->nwait, 1) == 1) {
		if (c->prev != NIL)
			cell(q, (size_t)e->pool, (size_t)c->prev)->next = c->next;
		else
			p->active = c->next;
		if (c->next != NIL)
			cell(q, (size_t)e->pool, (size_t)c->next)->prev = c->prev;
		c->next = c->prev = NIL;
	}
}

static void
row_push(struct sl_queue *q, int32_t i)
{
	struct q_entry *e = &q->e[i];
	struct q_row *r = &q->rows[e->row];

	e->next = NIL;
	e->prev = r->tail;
	if (r->tail != NIL)
		q->e[r->tail].next = i;
	else
		r->head = i;
	r->tail = i;
	if (atomic_exchange(&r->wake, 1) == 0) {
		q->to_wake[e->row] = 1;
		q->any_wake = 1;
	}
}

static void
row_remove(struct sl_queue *q, int32_t i)
{
	struct q_entry *e = &q->e[i];
	struct q_row *r = &q->rows[e->row];

	if (e->prev != NIL)
		q->e[e->prev].next = e->next;
	else
		r->head = e->next;
	if (e->next != NIL)
		q->e[e->next].prev = e->prev;
	else
		r->tail = e->prev;
	e->next = e->prev = NIL;
}

/* ---- the lock ------------------------------------------------------------ */

static void repair(struct sl_queue *, size_t win);

static void
q_lock(struct sl_queue *q, size_t win)
{
	int rc = pthread_mutex_lock(&q->h->lock);

	if (rc == EOWNERDEAD) {
		repair(q, win);
		atomic_fetch_add(&q->h->repairs, 1);
		pthread_mutex_consistent(&q->h->lock);
	}
}

/* Unlock, then wake the rows that got grants (one write per batch). */
static void
q_unlock(struct sl_queue *q)
{
	uint64_t one = 1;
	size_t r;
	ssize_t n;

	pthread_mutex_unlock(&q->h->lock);
	if (!q->any_wake)
		return;
	q->any_wake = 0;
	for (r = 0; r < q->nrows; r++)
		if (q->to_wake[r]) {
			q->to_wake[r] = 0;
			if (q->fds[r] >= 0)
				n = write(q->fds[r], &one, sizeof(one));
			(void)n;
		}
}

/* ---- choice and grants (under the lock) --------------------------------- */

/*
 * A tenant's oldest waiter that takes slot: its FIFO's head, unless some
 * waiter of the pool wants one replica only (a stored response's); then
 * the first of its FIFO that wants slot or any. NIL: none.
 */
static int32_t
first_taker(const struct sl_queue *q, const struct q_pool *p,
    const struct q_cell *c, size_t slot)
{
	int32_t i;

	if (p->npinned == 0)
		return c->head;
	for (i = c->head; i != NIL; i = q->e[i].next)
		if (q->e[i].want < 0 || (size_t)q->e[i].want == slot)
			return i;
	return NIL;
}

/*
 * The pool's next waiter for a slot of replica index slot: highest
 * priority band, then (tokens) lowest counter, then fewer waiters, or
 * (fifo) nothing more; then the oldest; a waiter that wants another
 * replica is passed over. NIL when nobody waits for it. Fewer waiters
 * breaks a tie of counters the way the latecomer wants it: a
 * tenant lifted on arrival to the counter of one with 40 waiters goes
 * first, although the other's running streams have not been charged yet
 * (tokens are counted when a response ends, after its slot went on).
 */
static int32_t
best(const struct sl_queue *q, size_t pool, size_t slot)
{
	const struct q_pool *p = &q->pools[pool];
	int fifo = atomic_load_explicit(&p->fairness, memory_order_relaxed) ==
	    SL_QUEUE_FIFO;
	int32_t t, win = NIL, band, wband = 0, n, wn = 0;
	uint64_t v, wv = 0;

	for (t = p->active; t != NIL; t = cell(q, pool, (size_t)t)->next) {
		const struct q_cell *c = cell(q, pool, (size_t)t);
		int32_t head = first_taker(q, p, c, slot);
		uint64_t seq;

		if (head == NIL)
			continue;
		seq = q->e[head].seq;

		band = atomic_load_explicit(&q->tenants[t].priority,
		    memory_order_relaxed);
		v = fifo ? 0 : service(q, pool, (size_t)t);
		n = fifo ? 0 : atomic_load_explicit(&c->nwait,
		    memory_order_relaxed);
		if (win == NIL || band > wband ||
		    (band == wband && (v < wv ||
		    (v == wv && (n < wn ||
		    (n == wn && seq < q->e[win].seq)))))) {
			win = head;
			wband = band;
			wv = v;
			wn = n;
		}
	}
	return win;
}

static uint64_t
weighted(const struct sl_queue *q, size_t tenant, uint64_t tokens)
{
	int32_t w = atomic_load_explicit(&q->tenants[tenant].weight,
	    memory_order_relaxed);

	if (w < 1)
		w = 1;
	if (tokens > UINT64_MAX / 1000)
		tokens = UINT64_MAX / 1000;
	return tokens * 1000 / (uint64_t)w;
}

/*
 * Entry i leaves its FIFO holding slot (held by the queue row; -1: its
 * pool was closed) and joins its row's grants; the dispatch cost is
 * charged now, so a tenant's next waiter sees it.
 */
static void
grant(struct sl_queue *q, int32_t i, int64_t slot)
{
	struct q_entry *e = &q->e[i];
	struct q_pool *p = &q->pools[e->pool];

	cell_remove(q, i);
	e->slot = slot;
	if (slot >= 0) {
		p->vref = service(q, (size_t)e->pool, (size_t)e->tenant);
		if (e->cost > 0)
			atomic_fetch_add(&cell(q, (size_t)e->pool,
			    (size_t)e->tenant)->service,
			    weighted(q, (size_t)e->tenant, e->cost));
	}
	row_push(q, i);
	atomic_store(&e->state, E_GRANTED);
}

/*
 * A slot held by the queue row is free to go: to the pool's next waiter,
 * or back to its replica (inside win's window).
 */
static void
pass_on(struct sl_queue *q, size_t win, size_t pool, size_t slot)
{
	int32_t i = best(q, pool, slot);

	if (i != NIL)
		grant(q, i, (int64_t)slot);
	else
		sl_shm_release_as(q->shm, win, SL_QUEUE_ROW, slot);
}

static int32_t
decode(const struct sl_queue *q, uint64_t handle, size_t row)
{
	uint32_t idx = (uint32_t)handle, gen = (uint32_t)(handle >> 32);
	const struct q_entry *e;

	if (idx >= q->nentries)
		return NIL;
	e = &q->e[idx];
	if (e->gen != gen || atomic_load(&e->state) == E_FREE ||
	    e->row != (int32_t)row)
		return NIL;
	return (int32_t)idx;
}

/* ---- settings ------------------------------------------------------------ */

void
sl_queue_set_pool(struct sl_queue *q, size_t pool, int32_t max,
    int32_t timeout_ms, enum sl_queue_fairness f)
{
	if (pool >= q->npools)
		return;
	atomic_store(&q->pools[pool].max, max < 0 ? 0 : max);
	atomic_store(&q->pools[pool].timeout_ms, timeout_ms);
	atomic_store(&q->pools[pool].fairness, (int32_t)f);
}

void
sl_queue_set_tenant(struct sl_queue *q, size_t tenant, int32_t weight,
    int32_t priority)
{
	if (tenant >= q->ntenants)
		return;
	atomic_store(&q->tenants[tenant].weight, weight < 1 ? 1 : weight);
	atomic_store(&q->tenants[tenant].priority, priority);
}

void
sl_queue_forget_tenant(struct sl_queue *q, size_t row, size_t tenant)
{
	size_t pl;

	if (q == NULL || tenant >= q->ntenants)
		return;
	q_lock(q, row);
	for (pl = 0; pl < q->npools; pl++)
		if (cell_page_used(q, pl * q->ntenants + tenant) ||
		    atomic_load(&q->pools[pl].max) > 0)
			atomic_store(&cell_ro(q, pl, tenant)->service, 0);
	q_unlock(q);
	atomic_store(&q->tenants[tenant].weight, 0);
	atomic_store(&q->tenants[tenant].priority, 0);
}

void
sl_queue_close_pool(struct sl_queue *q, size_t row, size_t pool)
{
	struct q_pool *p;

	if (pool >= q->npools)
		return;
	p = &q->pools[pool];
	q_lock(q, row);
	atomic_store(&p->max, 0);
	while (p->active != NIL)
		grant(q, cell(q, pool, (size_t)p->active)->head, -1);
	q_unlock(q);
}

void
sl_queue_reset_pool(struct sl_queue *q, size_t pool)
{
	struct q_pool *p;
	size_t t, i;
	int k;

	if (pool >= q->npools)
		return;
	p = &q->pools[pool];
	q_lock(q, SL_QUEUE_ROW);
	atomic_store(&p->max, 0);
	while (p->active != NIL)   /* none: it was closed; to be sure */
		grant(q, cell(q, pool, (size_t)p->active)->head, -1);
	atomic_store(&p->nwait, 0);
	p->seq = p->vref = 0;
	for (k = 0; k < SL_QUEUE_O_MAX; k++)
		atomic_store(&p->out[k], 0);
	atomic_store(&p->wait_ms, 0);
	for (k = 0; k <= SL_HIST_BUCKETS; k++)
		atomic_store(&p->wait_hist[k], 0);
	/* Only the cells of pages ever written: the others read 0. */
	for (t = 0; t < q->ntenants; t++) {
		i = pool * q->ntenants + t;
		if (!cell_page_used(q, i)) {
			t += CELLS_PER_PAGE - 1 - i % CELLS_PER_PAGE;
			continue;
		}
		atomic_store(&q->cells[i].service, 0);
		atomic_store(&q->cells[i].nwait, 0);
		q->cells[i].head = q->cells[i].tail = NIL;
		q->cells[i].next = q->cells[i].prev = NIL;
	}
	q_unlock(q);
}

int32_t
sl_queue_timeout_ms(const struct sl_queue *q, size_t pool)
{
	if (q == NULL || pool >= q->npools)
		return 0;
	return atomic_load(&((struct sl_queue *)q)->pools[pool].timeout_ms);
}

int32_t
sl_queue_waiting(const struct sl_queue *q, size_t pool)
{
	if (q == NULL || pool >= q->npools)
		return 0;
	return atomic_load(&((struct sl_queue *)q)->pools[pool].nwait);
}

/* ---- a waiter's life ------------------------------------------------------ */

enum sl_queue_res
sl_queue_enqueue(struct sl_queue *q, size_t row, size_t pool, size_t tenant,
    int64_t now_ms, uint64_t dispatch_cost, uint64_t *handle)
{
	return sl_queue_enqueue_for(q, row, pool, tenant, now_ms, dispatch_cost,
	    SL_QUEUE_ANY, handle);
}

enum sl_queue_res
sl_queue_enqueue_for(struct sl_queue *q, size_t row, size_t pool,
    size_t tenant, int64_t now_ms, uint64_t dispatch_cost, size_t want,
    uint64_t *handle)
{
	struct q_pool *p;
	struct q_entry *e;
	int32_t i, max;

	*handle = 0;
	if (pool >= q->npools || tenant >= q->ntenants || row >= q->nrows ||
	    row == SL_QUEUE_ROW)
		return SL_QUEUE_NONE;
	p = &q->pools[pool];
	if ((max = atomic_load(&p->max)) <= 0)
		return SL_QUEUE_NONE;
	if (atomic_load(&q->tenants[tenant].priority) < 0) {
		atomic_fetch_add(&p->out[SL_QUEUE_O_SHED], 1);
		return SL_QUEUE_SHED;
	}
	q_lock(q, row);
	if (atomic_load(&p->nwait) >= max || q->h->free_head == NIL) {
		q_unlock(q);
		atomic_fetch_add(&p->out[SL_QUEUE_O_FULL], 1);
		return SL_QUEUE_FULL;
	}
	i = q->h->free_head;
	e = &q->e[i];
	q->h->free_head = e->next;
	if (++e->gen == 0)
		e->gen = 1;
	e->pool = (int32_t)pool;
	e->tenant = (int32_t)tenant;
	e->row = (int32_t)row;
	e->enq_ms = now_ms;
	e->seq = ++p->seq;
	e->slot = -1;
	e->want = want == SL_QUEUE_ANY || want >= sl_shm_max_tenants(q->shm) ?
	    -1 : (int64_t)want;
	e->cost = dispatch_cost;
	cell_push(q, i, 1);
	atomic_store(&e->state, E_WAITING);
	*handle = (uint64_t)e->gen << 32 | (uint32_t)i;
	q_unlock(q);
	return SL_QUEUE_OK;
}

int
sl_queue_offer(struct sl_queue *q, size_t row, size_t pool, size_t slot,
    int64_t now_ms)
{
	int32_t i;

	(void)now_ms;
	if (pool >= q->npools || row >= q->nrows || row == SL_QUEUE_ROW ||
	    atomic_load(&q->pools[pool].nwait) == 0)
		return 0;
	q_lock(q, row);
	if ((i = best(q, pool, slot)) == NIL) {
		q_unlock(q);
		return 0;
	}
	/* The slot first: a crash between leaves a surplus, never a debt. */
	sl_shm_move(q->shm, row, row, SL_QUEUE_ROW, slot);
	grant(q, i, (int64_t)slot);
	q_unlock(q);
	return 1;
}

/* A dispatched waiter's wait, in sl_shm's histogram buckets (seconds). */
static void
observe_wait(struct q_pool *p, int64_t ms)
{
	const double *b = sl_shm_hist_bounds();
	double sec = ms > 0 ? (double)ms / 1000.0 : 0;
	int i;

	for (i = 0; i < SL_HIST_BUCKETS && sec > b[i]; i++)
		;
	atomic_fetch_add(&p->wait_hist[i], 1);
}

size_t
sl_queue_collect(struct sl_queue *q, size_t row, struct sl_queue_grant *out,
    size_t max, int64_t now_ms)
{
	struct q_entry *e;
	uint64_t buf;
	size_t n = 0;
	int32_t i;
	ssize_t rd;

	if (row >= q->nrows || row == SL_QUEUE_ROW)
		return 0;
	if (q->fds[row] >= 0) {
		rd = read(q->fds[row], &buf, sizeof(buf));
		(void)rd;
	}
	q_lock(q, row);
	atomic_store(&q->rows[row].wake, 0);
	while (n < max && (i = q->rows[row].head) != NIL) {
		e = &q->e[i];
		row_remove(q, i);
		out[n].handle = (uint64_t)e->gen << 32 | (uint32_t)i;
		out[n].pool = (size_t)e->pool;
		out[n].waited_ms = now_ms - e->enq_ms;
		if (e->slot >= 0) {
			out[n].slot = (size_t)e->slot;
			/* The slot first: a crash between leaves a debt the
			 * repair settles by taking the grant back. */
			sl_shm_move(q->shm, row, SL_QUEUE_ROW, row,
			    (size_t)e->slot);
			atomic_fetch_add(&q->pools[e->pool].out[
			    SL_QUEUE_O_DISPATCHED], 1);
			atomic_fetch_add(&q->pools[e->pool].wait_ms,
			    out[n].waited_ms > 0 ? (uint64_t)out[n].waited_ms : 0);
			observe_wait(&q->pools[e->pool], out[n].waited_ms);
		} else
			out[n].slot = SL_QUEUE_CLOSED;
		free_push(q, i);
		n++;
	}
	if (q->rows[row].head != NIL)
		atomic_store(&q->rows[row].wake, 1);
	q_unlock(q);
	return n;
}

int
sl_queue_cancel(struct sl_queue *q, size_t row, uint64_t handle,
    enum sl_queue_outcome why)
{
	struct q_entry *e;
	int32_t i;
	int64_t slot;
	size_t pool;
	int rc;

	if (row >= q->nrows || why >= SL_QUEUE_O_MAX)
		return -1;
	q_lock(q, row);
	if ((i = decode(q, handle, row)) == NIL) {
		q_unlock(q);
		return -1;
	}
	e = &q->e[i];
	pool = (size_t)e->pool;
	atomic_fetch_add(&q->pools[pool].out[why], 1);
	if (atomic_load(&e->state) == E_WAITING) {
		cell_remove(q, i);
		free_push(q, i);
		rc = 0;
	} else {
		slot = e->slot;
		row_remove(q, i);
		/* The entry first: a crash between leaves a surplus. */
		free_push(q, i);
		if (slot >= 0)
			pass_on(q, row, pool, (size_t)slot);
		rc = 1;
	}
	q_unlock(q);
	return rc;
}

size_t
sl_queue_expire(struct sl_queue *q, size_t row, int64_t now_ms,
    uint64_t *out, size_t max)
{
	struct q_entry *e;
	int32_t t;
	size_t i, n = 0;

	if (row >= q->nrows || row == SL_QUEUE_ROW)
		return 0;
	q_lock(q, row);
	for (i = 0; i < q->nentries && n < max; i++) {
		e = &q->e[i];
		if (atomic_load_explicit(&e->state, memory_order_relaxed) !=
		    E_WAITING || e->row != (int32_t)row)
			continue;
		t = atomic_load(&q->pools[e->pool].timeout_ms);
		if (t <= 0 || now_ms - e->enq_ms < t)
			continue;
		out[n++] = (uint64_t)e->gen << 32 | (uint32_t)i;
		atomic_fetch_add(&q->pools[e->pool].out[SL_QUEUE_O_TIMEOUT], 1);
		cell_remove(q, (int32_t)i);
		free_push(q, (int32_t)i);
	}
	q_unlock(q);
	return n;
}

void
sl_queue_charge(struct sl_queue *q, size_t pool, size_t tenant,
    uint64_t tokens)
{
	if (q == NULL || pool >= q->npools || tenant >= q->ntenants ||
	    tokens == 0)
		return;
	/*
	 * A pool without a queue orders nobody: no counter (and no page of
	 * cells per tenant). One that gets a queue by reload starts everyone
	 * at 0, and the lift on arrival evens the rest.
	 */
	if (atomic_load_explicit(&q->pools[pool].max, memory_order_relaxed) <= 0)
		return;
	atomic_fetch_add_explicit(&cell_ro(q, pool, tenant)->service,
	    weighted(q, tenant, tokens), memory_order_relaxed);
}

/* ---- crashes ------------------------------------------------------------- */

/* qsort has no argument: the entries being sorted, under the lock. */
static const struct q_entry *sort_entries;

static int
cmp_entries(const void *a, const void *b)
{
	const struct q_entry *x = &sort_entries[*(const int32_t *)a];
	const struct q_entry *y = &sort_entries[*(const int32_t *)b];

	if (x->pool != y->pool)
		return x->pool < y->pool ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/*
 * Rebuild every list and count from the entries' states, and bring the
 * queue row's held cells back to the GRANTED entries: a surplus slot goes
 * back to its replica (inside win's window), a grant without its slot
 * waits again. Under the lock, after its owner died (or at reclaim).
 */
static void
repair(struct sl_queue *q, size_t win)
{
	size_t i, nidx = sl_shm_max_tenants(q->shm), nw = 0;
	int32_t *count, *order, h;
	struct q_entry *e;
	int64_t s;

	count = calloc(nidx, sizeof(*count));
	order = calloc(q->nentries, sizeof(*order));
	for (i = 0; i < q->nentries; i++) {
		e = &q->e[i];
		s = atomic_load(&e->state);
		if (s != E_FREE && (e->pool < 0 || (size_t)e->pool >= q->npools ||
		    e->tenant < 0 || (size_t)e->tenant >= q->ntenants ||
		    e->row <= 0 || (size_t)e->row >= q->nrows))
			atomic_store(&e->state, E_FREE);
		else if (s == E_GRANTED && e->slot >= 0 && count != NULL &&
		    (size_t)e->slot < nidx)
			count[e->slot]++;
	}
	for (i = 0; count != NULL && i < nidx; i++) {
		h = sl_shm_held(q->shm, SL_QUEUE_ROW, i);
		for (; h > count[i]; h--)
			sl_shm_release_as(q->shm, win, SL_QUEUE_ROW, i);
		count[i] -= h;   /* grants without their slot */
	}
	for (i = 0; i < q->nentries; i++) {
		e = &q->e[i];
		if (count != NULL && atomic_load(&e->state) == E_GRANTED &&
		    e->slot >= 0 && (size_t)e->slot < nidx &&
		    count[e->slot] > 0) {
			count[e->slot]--;
			e->slot = -1;
			atomic_store(&e->state, E_WAITING);
		}
	}
	reset_lists(q);
	for (i = q->nentries; i-- > 0;) {
		e = &q->e[i];
		s = atomic_load(&e->state);
		if (s == E_FREE)
			free_push(q, (int32_t)i);
		else if (s == E_GRANTED)
			row_push(q, (int32_t)i);
		else if (order != NULL)
			order[nw++] = (int32_t)i;
		else {
			/* Out of memory: order within a tenant may suffer. */
			cell_push(q, (int32_t)i, 0);
		}
	}
	if (order != NULL) {
		sort_entries = q->e;
		qsort(order, nw, sizeof(*order), cmp_entries);
		for (i = 0; i < nw; i++)
			cell_push(q, order[i], 0);
	}
	free(order);
	free(count);
}

size_t
sl_queue_reclaim_rows(struct sl_queue *q, const size_t *rows, size_t n)
{
	unsigned char *dead;
	struct q_entry *e;
	size_t i, dropped = 0;
	int32_t s;
	int64_t slot;

	if ((dead = calloc(q->nrows, 1)) == NULL)
		return 0;
	for (i = 0; i < n; i++)
		if (rows[i] < q->nrows && rows[i] != SL_QUEUE_ROW)
			dead[rows[i]] = 1;
	/*
	 * A dead row that held the lock makes this an owner-dead lock: the
	 * repair runs first. Otherwise the lists are whole (every change to
	 * them and to the queue row's held cells is under the lock).
	 */
	q_lock(q, SL_QUEUE_ROW);
	for (i = 0; i < q->nentries; i++) {
		e = &q->e[i];
		s = atomic_load(&e->state);
		if (s == E_FREE || !dead[e->row])
			continue;
		atomic_fetch_add(&q->pools[e->pool].out[SL_QUEUE_O_GONE], 1);
		dropped++;
		if (s == E_WAITING) {
			cell_remove(q, (int32_t)i);
			free_push(q, (int32_t)i);
			continue;
		}
		slot = e->slot;
		row_remove(q, (int32_t)i);
		free_push(q, (int32_t)i);
		if (slot >= 0)
			pass_on(q, SL_QUEUE_ROW, (size_t)e->pool, (size_t)slot);
	}
	for (i = 0; i < q->nrows; i++)
		if (dead[i]) {
			atomic_store(&q->rows[i].wake, 0);
			q->to_wake[i] = 0;
		}
	q_unlock(q);
	free(dead);
	return dropped;
}

/* ---- reading ------------------------------------------------------------- */

int32_t
sl_queue_waiting_tenant(const struct sl_queue *q, size_t pool, size_t tenant)
{
	if (pool >= q->npools || tenant >= q->ntenants)
		return 0;
	return atomic_load(&cell_ro(q, pool, tenant)->nwait);
}

uint64_t
sl_queue_service(const struct sl_queue *q, size_t pool, size_t tenant)
{
	if (pool >= q->npools || tenant >= q->ntenants)
		return 0;
	return service(q, pool, tenant);
}

uint64_t
sl_queue_outcomes(const struct sl_queue *q, size_t pool,
    enum sl_queue_outcome o)
{
	if (pool >= q->npools || o >= SL_QUEUE_O_MAX)
		return 0;
	return atomic_load(&((struct sl_queue *)q)->pools[pool].out[o]);
}

uint64_t
sl_queue_wait_ms_sum(const struct sl_queue *q, size_t pool)
{
	if (pool >= q->npools)
		return 0;
	return atomic_load(&((struct sl_queue *)q)->pools[pool].wait_ms);
}

void
sl_queue_lock_for_test(struct sl_queue *q, size_t row)
{
	q_lock(q, row);
}

uint64_t
sl_queue_wait_bucket(const struct sl_queue *q, size_t pool, int b)
{
	uint64_t n = 0;
	int i;

	if (pool >= q->npools || b < 0 || b > SL_HIST_BUCKETS)
		return 0;
	for (i = 0; i <= b; i++)
		n += atomic_load(&((struct sl_queue *)q)->pools[pool].wait_hist[i]);
	return n;
}

uint64_t
sl_queue_repairs(const struct sl_queue *q)
{
	return atomic_load(&((struct sl_queue *)q)->h->repairs);
}

#define BROKEN(...) do { snprintf(why, whylen, __VA_ARGS__); goto out; } while (0)

int
sl_queue_check(struct sl_queue *q, char *why, size_t whylen)
{
	size_t pl, t, r, i, nidx = sl_shm_max_tenants(q->shm);
	size_t nfree = 0, nwait = 0, ngrant = 0, k;
	int32_t j, prevj, *count = NULL, cnt, s;
	char dummy[1];
	int rc = -1;

	if (why == NULL) {
		why = dummy;
		whylen = sizeof(dummy);
	}
	q_lock(q, SL_QUEUE_ROW);
	if ((count = calloc(nidx, sizeof(*count))) == NULL)
		BROKEN("out of memory");
	for (j = q->h->free_head, k = 0; j != NIL && k <= q->nentries;
	    j = q->e[j].next, k++) {
		if (atomic_load(&q->e[j].state) != E_FREE)
			BROKEN("entry %d on the free list is not free", (int)j);
		nfree++;
	}
	for (pl = 0; pl < q->npools; pl++) {
		size_t pw = 0, ncells = 0, npin = 0;

		for (t = 0; t < q->ntenants; t++) {
			struct q_cell *c;

			if (!cell_page_used(q, pl * q->ntenants + t))
				continue;   /* never written: nobody waits */
			c = cell(q, pl, t);

			cnt = 0;
			prevj = NIL;
			for (j = c->head; j != NIL; prevj = j, j = q->e[j].next) {
				struct q_entry *e = &q->e[j];

				if (atomic_load(&e->state) != E_WAITING ||
				    e->pool != (int32_t)pl ||
				    e->tenant != (int32_t)t || e->prev != prevj)
					BROKEN("pool %zu tenant %zu: entry %d "
					    "misplaced", pl, t, (int)j);
				if (prevj != NIL && q->e[prevj].seq >= e->seq)
					BROKEN("pool %zu tenant %zu: FIFO out of "
					    "order", pl, t);
				if (++cnt > (int32_t)q->nentries)
					BROKEN("pool %zu tenant %zu: FIFO loops",
					    pl, t);
				if (e->want >= 0)
					npin++;
			}
			if (c->tail != prevj)
				BROKEN("pool %zu tenant %zu: tail", pl, t);
			if (cnt != atomic_load(&c->nwait))
				BROKEN("pool %zu tenant %zu: %d waiting, count "
				    "says %d", pl, t, (int)cnt,
				    (int)atomic_load(&c->nwait));
			pw += (size_t)cnt;
			if (cnt > 0)
				ncells++;
		}
		for (j = q->pools[pl].active, k = 0; j != NIL;
		    j = cell(q, pl, (size_t)j)->next, k++)
			if (atomic_load(&cell(q, pl, (size_t)j)->nwait) == 0 ||
			    k > q->ntenants)
				BROKEN("pool %zu: active list", pl);
		if (k != ncells)
			BROKEN("pool %zu: %zu tenants waiting, %zu active", pl,
			    ncells, k);
		if ((int32_t)npin != q->pools[pl].npinned)
			BROKEN("pool %zu: %zu pinned, count says %d", pl, npin,
			    (int)q->pools[pl].npinned);
		if ((int32_t)pw != atomic_load(&q->pools[pl].nwait))
			BROKEN("pool %zu: %zu waiting, count says %d", pl, pw,
			    (int)atomic_load(&q->pools[pl].nwait));
		nwait += pw;
	}
	for (r = 0; r < q->nrows; r++) {
		prevj = NIL;
		for (j = q->rows[r].head, k = 0; j != NIL;
		    prevj = j, j = q->e[j].next, k++) {
			struct q_entry *e = &q->e[j];

			if (atomic_load(&e->state) != E_GRANTED ||
			    e->row != (int32_t)r || e->prev != prevj ||
			    k > q->nentries)
				BROKEN("row %zu: grant %d misplaced", r, (int)j);
			if (e->slot >= 0 && (size_t)e->slot < nidx)
				count[e->slot]++;
			ngrant++;
		}
		if (q->rows[r].tail != prevj)
			BROKEN("row %zu: tail", r);
	}
	if (nfree + nwait + ngrant != q->nentries)
		BROKEN("%zu free + %zu waiting + %zu granted != %zu entries",
		    nfree, nwait, ngrant, q->nentries);
	for (i = 0; i < nidx; i++) {
		s = sl_shm_held(q->shm, SL_QUEUE_ROW, i);
		if (s != count[i])
			BROKEN("slot %zu: the queue row holds %d, %d granted",
			    i, (int)s, (int)count[i]);
	}
	rc = 0;
	if (whylen > 0)
		why[0] = '\0';
out:
	q_unlock(q);
	free(count);
	return rc;
}
