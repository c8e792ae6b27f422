/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Upstream pools: replica choice and what a try's outcome means for a
 * replica. See sl_upstream.h.
 */
#include "config.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "sl_affinity.h"
#include "sl_log.h"
#include "sl_queue.h"
#include "sl_upstream.h"

#define EJECT_MAX_MS (5 * 60 * 1000)   /* ejection backoff cap: 5 min */
#define KV_FULL 950                     /* per mille: a KV cache this full is
					 * chosen only when all are */

struct pool {
	const struct sl_upstream_conf *conf;
	size_t *slot;                /* [nreplicas] shared index */
	uint32_t *epoch;             /* [nreplicas] the index's, at mapping */
	int64_t *rr_current;         /* smooth weighted round robin state */
	uint64_t *rid;               /* [nreplicas] rendezvous identity (URL) */
	uint64_t was_down;           /* replicas seen down: affinity dropped */
};

struct sl_pools {
	struct sl_shm *shm;
	size_t row;
	struct pool *p;
	size_t n;
	uint64_t rng;
	struct sl_affinity *aff;     /* NULL: no upstream uses prefix_affinity */
	uint64_t *hashes;            /* [SL_POOL_MAX_BLOCKS] one request's */
	struct sl_queue *q;          /* NULL: no fair queue */
	const size_t *qpool;         /* [n] the queue's pool index of u */
};

/* xorshift64*: ties and weighted random draws, per worker, no locking. */
static uint64_t
rnd(struct sl_pools *ps)
{
	uint64_t x = ps->rng;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	ps->rng = x;
	return x * 2685821657736338717ULL;
}

static int rr_choose(const struct pool *, uint64_t);
static void rr_commit(struct pool *, uint64_t, int);

/*
 * least_loaded breaks ties by smooth weighted round robin, per worker:
 * each worker starts at its own point of the cycle, so workers that see
 * the same counts at once do not all send to the same replica. A whole
 * cycle still gives each replica its weight.
 */
static void
rr_phase(struct sl_pools *ps, struct pool *p)
{
	uint64_t all = 0, total = 0, k;
	size_t r;

	for (r = 0; r < p->conf->nreplicas && r < 64; r++) {
		all |= 1ULL << r;
		total += (uint64_t)p->conf->replicas[r].weight;
	}
	if (total == 0)
		return;
	for (k = rnd(ps) % total; k > 0; k--)
		rr_commit(p, all, rr_choose(p, all));
}

struct sl_pools *
sl_pools_new(const struct sl_config *cfg, struct sl_shm *shm, size_t row,
    const size_t *const *replica_slot, const uint32_t *epoch)
{
	struct sl_pools *ps;
	size_t u, r;

	if ((ps = calloc(1, sizeof(*ps))) == NULL)
		return NULL;
	ps->shm = shm;
	ps->row = row;
	ps->n = cfg->nupstreams;
	ps->rng = ((uint64_t)getpid() << 32) ^ (uint64_t)sl_mono_ms() ^
	    0x9e3779b97f4a7c15ULL;
	if ((ps->p = calloc(ps->n ? ps->n : 1, sizeof(*ps->p))) == NULL)
		goto fail;
	for (u = 0; u < ps->n; u++) {
		struct pool *p = &ps->p[u];
		size_t nr = cfg->upstreams[u].nreplicas;

		p->conf = &cfg->upstreams[u];
		p->slot = calloc(nr ? nr : 1, sizeof(*p->slot));
		p->rr_current = calloc(nr ? nr : 1, sizeof(*p->rr_current));
		p->rid = calloc(nr ? nr : 1, sizeof(*p->rid));
		p->epoch = calloc(nr ? nr : 1, sizeof(*p->epoch));
		if (p->slot == NULL || p->rr_current == NULL || p->rid == NULL ||
		    p->epoch == NULL)
			goto fail;
		for (r = 0; r < nr; r++) {
			p->slot[r] = replica_slot[u][r];
			p->epoch[r] = epoch != NULL ? epoch[p->slot[r]] :
			    sl_shm_epoch(shm, p->slot[r]);
			p->rid[r] = sl_affinity_id(p->conf->replicas[r].url);
		}
		if (p->conf->balance != SL_BALANCE_ROUND_ROBIN &&
		    p->conf->balance != SL_BALANCE_RANDOM)
			rr_phase(ps, p);
		if (p->conf->balance == SL_BALANCE_PREFIX_AFFINITY &&
		    ps->aff == NULL) {
			ps->aff = sl_affinity_new(SL_POOL_AFFINITY_ENTRIES);
			ps->hashes = calloc(SL_POOL_MAX_BLOCKS,
			    sizeof(*ps->hashes));
			if (ps->aff == NULL || ps->hashes == NULL)
				goto fail;
		}
	}
	return ps;
fail:
	sl_pools_free(ps);
	return NULL;
}

void
sl_pools_free(struct sl_pools *ps)
{
	size_t u;

	if (ps == NULL)
		return;
	for (u = 0; ps->p != NULL && u < ps->n; u++) {
		free(ps->p[u].slot);
		free(ps->p[u].rr_current);
		free(ps->p[u].rid);
		free(ps->p[u].epoch);
	}
	free(ps->p);
	sl_affinity_free(ps->aff);
	free(ps->hashes);
	free(ps);
}

/*
 * Was replica r's shared index reused for another replica since this
 * worker's mapping (a reload removed r, its streams ended)? Then it is
 * not r any more: never a candidate again.
 */
static int
reused(const struct sl_pools *ps, const struct pool *p, size_t r)
{
	return sl_shm_epoch(ps->shm, p->slot[r]) != p->epoch[r];
}

/* The longest a busy mark lasts (upstreams.*.busy_max), in ms. */
static int64_t
busy_max_ms(const struct pool *p)
{
	return p->conf->busy_max_ms > 0 ? (int64_t)p->conf->busy_max_ms :
	    SL_BUSY_MAX_DEFAULT_MS;
}

/* Why a replica cannot take a try now, and for how long (ms); 0: it can. */
static int64_t
unavailable_ms(const struct pool *p, struct sl_shm *shm, size_t r, int64_t now)
{
	struct sl_shm_replica *h = sl_shm_replica(shm, p->slot[r]);
	int64_t until, wait = 0;

	if (h == NULL)
		return 1000;
	if (atomic_load_explicit(&h->down, memory_order_relaxed) != 0) {
		/* Up again after `rise` good probes at the earliest. */
		wait = (int64_t)p->conf->health.interval_ms * p->conf->health.rise;
		return wait > 0 ? wait : 1000;
	}
	until = atomic_load_explicit(&h->ejected_until_ms, memory_order_relaxed);
	if (until > now)
		wait = until - now;
	until = atomic_load_explicit(&h->busy_until_ms, memory_order_relaxed);
	if (until > now && until - now > wait)
		wait = until - now;
	if (wait == 0 && sl_shm_inflight(shm, p->slot[r]) >=
	    sl_shm_limit(shm, p->slot[r]))
		wait = 1000;   /* at its cap: a stream ends any moment */
	return wait;
}

/*
 * The runner's own figures for replica r, when load_metrics scraped them
 * less than 4 intervals ago; 0 (and nothing set) otherwise.
 */
static int
fresh_sample(const struct pool *p, struct sl_shm *shm, size_t r, int64_t now,
    int32_t *waiting, int32_t *kv)
{
	struct sl_shm_replica *h;
	int64_t at;

	if (!p->conf->load_metrics.enabled ||
	    (h = sl_shm_replica(shm, p->slot[r])) == NULL)
		return 0;
	at = atomic_load_explicit(&h->lm_at_ms, memory_order_acquire);
	if (at == 0 || now - at > 4 * (int64_t)p->conf->load_metrics.interval_ms)
		return 0;
	*waiting = atomic_load_explicit(&h->lm_waiting, memory_order_relaxed);
	*kv = atomic_load_explicit(&h->lm_kv, memory_order_relaxed);
	return 1;
}

/*
 * A replica's load: the streams this node has in flight to it (exact,
 * all workers), plus the requests waiting in its queue when a fresh
 * sample says so.
 */
static int64_t
replica_load(const struct pool *p, struct sl_shm *shm, size_t r, int64_t now)
{
	int32_t waiting, kv;
	int64_t l = sl_shm_inflight(shm, p->slot[r]);

	if (fresh_sample(p, shm, r, now, &waiting, &kv) && waiting > 0)
		l += waiting;
	return l;
}

/*
 * prefix_affinity's load: the streams this node has in flight to the
 * replica, or, when a fresh sample says the runner holds more (running +
 * waiting: other nodes' requests too), that. Not their sum, as
 * least_loaded ranks: with one node the runner's queue is made of this
 * node's own in-flight streams, and counting it twice made affinity spill
 * twice as often (bench/routing, shared prefill compute: 302 spills of
 * 2,143 requests against 121 without load_metrics, p99 TTFT 566 ms
 * against 465), and every spill pays a conversation's whole prefill.
 */
static int64_t
affine_load(const struct pool *p, struct sl_shm *shm, size_t r, int64_t now)
{
	struct sl_shm_replica *h;
	int32_t waiting, kv, running;
	int64_t l = sl_shm_inflight(shm, p->slot[r]);

	if (!fresh_sample(p, shm, r, now, &waiting, &kv) ||
	    (h = sl_shm_replica(shm, p->slot[r])) == NULL)
		return l;
	running = atomic_load_explicit(&h->lm_running, memory_order_relaxed);
	if (waiting < 0 || running < 0)
		return waiting > 0 ? l + waiting : l;   /* a page without running */
	return (int64_t)running + waiting > l ? (int64_t)running + waiting : l;
}

/* Candidates whose KV cache is over KV_FULL go only if all are. */
static uint64_t
kv_filter(const struct pool *p, struct sl_shm *shm, uint64_t cand, int64_t now)
{
	uint64_t full = 0;
	size_t r;

	if (!p->conf->load_metrics.enabled)
		return cand;
	for (r = 0; r < p->conf->nreplicas && r < 64; r++) {
		int32_t waiting, kv;

		if ((cand >> r & 1) && fresh_sample(p, shm, r, now, &waiting,
		    &kv) && kv > KV_FULL)
			full |= 1ULL << r;
	}
	return (cand & ~full) != 0 ? cand & ~full : cand;
}

/*
 * nginx's smooth weighted round robin among the replicas of `set`: the one
 * whose current + weight is highest (the first of equals). Nothing moves
 * here: rr_commit moves the counters once the chosen replica's slot is
 * taken, so a replica that turned out full (another worker took its last
 * slot) or one that was not a candidate (at its cap, busy, down) keeps
 * its place in the cycle, as in nginx, where a replica that cannot take
 * the request is skipped without its counter moving.
 */
static int
rr_choose(const struct pool *p, uint64_t set)
{
	size_t nr = p->conf->nreplicas, r;
	int best = -1;

	for (r = 0; r < nr && r < 64; r++) {
		if (!(set >> r & 1))
			continue;
		if (best < 0 || p->rr_current[r] + p->conf->replicas[r].weight >
		    p->rr_current[best] + p->conf->replicas[best].weight)
			best = (int)r;
	}
	return best;
}

/* The chosen replica took the try: move the counters of `set`. */
static void
rr_commit(struct pool *p, uint64_t set, int pick)
{
	size_t nr = p->conf->nreplicas, r;
	int64_t total = 0;

	if (pick < 0 || !(set >> pick & 1))
		return;
	for (r = 0; r < nr && r < 64; r++)
		if (set >> r & 1) {
			p->rr_current[r] += p->conf->replicas[r].weight;
			total += p->conf->replicas[r].weight;
		}
	p->rr_current[pick] -= total;
}

/*
 * Among the candidates (bits of `cand`), the policy's choice; *rr_set gets
 * the replicas whose round-robin counters move if the choice takes the
 * try (rr_commit), 0 for none.
 */
static int
choose(struct sl_pools *ps, struct pool *p, uint64_t cand, uint64_t *rr_set)
{
	size_t nr = p->conf->nreplicas, r;

	*rr_set = 0;
	switch (p->conf->balance) {
	case SL_BALANCE_ROUND_ROBIN:
		*rr_set = cand;
		return rr_choose(p, cand);
	case SL_BALANCE_RANDOM: {
		uint64_t total = 0, x;

		for (r = 0; r < nr; r++)
			if (cand >> r & 1)
				total += (uint64_t)p->conf->replicas[r].weight;
		if (total == 0)
			return -1;
		x = rnd(ps) % total;
		for (r = 0; r < nr; r++) {
			if (!(cand >> r & 1))
				continue;
			if (x < (uint64_t)p->conf->replicas[r].weight)
				return (int)r;
			x -= (uint64_t)p->conf->replicas[r].weight;
		}
		return -1;
	}
	case SL_BALANCE_LEAST_LOADED:
	case SL_BALANCE_PREFIX_AFFINITY:   /* a request without a prompt */
	default: {
		/*
		 * Lowest load / weight, compared by cross-multiplying; among
		 * equals, smooth weighted round robin. At light load every
		 * replica is at 0 and equal, so sequential traffic follows the
		 * weights (3:1:1 gives 60/20/20 of 100 on one worker) as
		 * concurrent traffic does; drawing equals uniformly split it
		 * 28/33/39.
		 */
		int64_t bl = 0, bw = 1, now = sl_mono_ms();
		uint64_t ties = 0;

		cand = kv_filter(p, ps->shm, cand, now);
		for (r = 0; r < nr && r < 64; r++) {
			int64_t l, wt;

			if (!(cand >> r & 1))
				continue;
			l = replica_load(p, ps->shm, r, now);
			wt = p->conf->replicas[r].weight;
			if (ties == 0 || l * bw < bl * wt) {
				bl = l;
				bw = wt;
				ties = 1ULL << r;
			} else if (l * bw == bl * wt)
				ties |= 1ULL << r;
		}
		*rr_set = ties;
		return rr_choose(p, ties);
	}
	}
}

/*
 * Prefix affinity's choice among cand for a prompt with hashes h[0..n):
 * the replica holding its longest known prefix, unless that one is over
 * max_imbalance x the least loaded's load and over it by 2 or more.
 * A prefix that never ended a routed prompt (ended == 0) is one that
 * other prompts share, a system prompt: the prompt starts a new
 * conversation, and its holder gets it only while it is among the least
 * loaded. (Following a shared prefix under load stacked a group's new
 * conversations on one replica, and each later spill of one of them paid
 * its whole history's prefill: on bench/routing with shared prefill
 * compute, 16 % of chat requests spilled.)
 * Otherwise (no known prefix, or the holder cannot take it) the
 * rendezvous choice of the first block among the least loaded replicas:
 * every worker and node agrees on a new prompt while their counts agree
 * (an idle pool), and under load a new prompt goes where least_loaded
 * would send it. (Among all replicas "not overloaded" instead, prompts
 * without a shared prefix queued behind busy replicas: p99 TTFT 1.3x
 * least_loaded's on bench/routing's unique workload; now 1.0x.)
 */
static int
choose_affine(struct sl_pools *ps, struct pool *p, uint64_t cand,
    const uint64_t *h, int held, int ended, enum sl_aff_outcome *out)
{
	size_t nr = p->conf->nreplicas, r, k = 0;
	int64_t load[64], wt[64], least = -1, lw = 1, now = sl_mono_ms();
	int64_t rank[64], lowest = -1, rw = 1;
	int64_t mi = p->conf->affinity.max_imbalance;
	uint64_t ids[64];
	int idx[64], wk[64], pick;

	/*
	 * Loads are per unit of weight (a replica of weight 2 is as loaded
	 * with 4 streams as one of weight 1 with 2), compared by
	 * cross-multiplying; with equal weights every rule below is the
	 * unweighted one.
	 */
	cand = kv_filter(p, ps->shm, cand, now);
	for (r = 0; r < nr && r < 64; r++) {
		if (!(cand >> r & 1))
			continue;
		wt[r] = p->conf->replicas[r].weight;
		load[r] = affine_load(p, ps->shm, r, now);
		if (least < 0 || load[r] * lw < least * wt[r]) {
			least = load[r];
			lw = wt[r];
		}
		/*
		 * Where a prompt goes when it leaves (or has no) holder:
		 * least_loaded's rank, in which a runner's queue counts
		 * against it on top of the streams (it steers new work
		 * away from a queue; affine_load only decides a spill).
		 */
		rank[r] = replica_load(p, ps->shm, r, now);
		if (lowest < 0 || rank[r] * rw < lowest * wt[r]) {
			lowest = rank[r];
			rw = wt[r];
		}
	}
	if (least < 0)
		return -1;
	/*
	 * Over: its load per weight is over max_imbalance x the least's, and
	 * its streams are 2 or more over what the least's level would give it.
	 */
#define OVER(r) (load[r] * 100 * lw > mi * least * wt[r] && \
	load[r] * lw >= least * wt[r] + 2 * lw)
#define LOWEST(r) (rank[r] * rw == lowest * wt[r])
	if (held >= 0 && (size_t)held < nr && (cand >> held & 1) &&
	    (ended ? !OVER(held) : LOWEST(held))) {
		*out = SL_AFF_HIT;
		return held;
	}
	*out = held >= 0 && ended ? SL_AFF_SPILL : SL_AFF_MISS;
	for (r = 0; r < nr && r < 64; r++)
		if ((cand >> r & 1) && LOWEST(r)) {
			ids[k] = p->rid[r];
			wk[k] = (int)wt[r];
			idx[k++] = (int)r;
		}
#undef OVER
#undef LOWEST
	pick = sl_affinity_rendezvous_weighted(h[0], ids, wk, k);
	return pick >= 0 ? idx[pick] : -1;
}

/*
 * The workers' shared hints (sl_shm_hint_*) may know a longer prefix than
 * this worker's table (another worker routed the conversation's last
 * turn), or where the same prefix went since (another worker spilled it):
 * scan h from the longest down to the length this worker matched, and take
 * the first hint that names a replica of this pool (down or not: a holder
 * that is down makes the request a spill).
 */
static void
hints_lookup(const struct sl_pools *ps, const struct pool *p, const uint64_t *h,
    size_t nh, int *held, size_t *matched, int *ended)
{
	size_t i = nh, lo = *matched > 0 ? *matched - 1 : 0, slot, r;
	int e;

	while (i-- > lo) {
		if (sl_shm_hint_get(ps->shm, h[i], &slot, &e) < 0)
			continue;
		for (r = 0; r < p->conf->nreplicas && r < 64; r++)
			if (p->slot[r] == slot) {
				*held = (int)r;
				*matched = i + 1;
				*ended = e;
				return;
			}
	}
}

/* Publish h[0..n) as routed to replica r; h[n-1] ended the prompt. */
static void
hints_record(struct sl_pools *ps, const struct pool *p, const uint64_t *h, size_t n,
    int r)
{
	size_t i;

	for (i = 0; i < n; i++)
		sl_shm_hint_put(ps->shm, h[i], p->slot[r], i + 1 == n);
}

static int
pick(struct sl_pools *ps, size_t u, uint64_t tried, const uint64_t *h,
    size_t nh, int *retry_after, int *outcome)
{
	struct pool *p;
	int64_t now, wait, min_wait = -1;
	uint64_t cand = 0, down = 0;
	size_t r, nr, matched = 0;
	int pick, held = -1, ended = 0, took;
	enum sl_aff_outcome aff = SL_AFF_MISS;
	uint64_t rr_set = 0;

	*retry_after = 1;
	if (outcome != NULL)
		*outcome = -1;
	if (u >= ps->n)
		return -1;
	p = &ps->p[u];
	nr = p->conf->nreplicas;
	now = sl_mono_ms();
	for (r = 0; r < nr && r < 64; r++) {
		struct sl_shm_replica *hr = sl_shm_replica(ps->shm, p->slot[r]);

		if (hr != NULL && atomic_load_explicit(&hr->down,
		    memory_order_relaxed) != 0)
			down |= 1ULL << r;
		if ((tried >> r & 1) || reused(ps, p, r))
			continue;
		wait = unavailable_ms(p, ps->shm, r, now);
		if (wait == 0)
			cand |= 1ULL << r;
		else if (min_wait < 0 || wait < min_wait)
			min_wait = wait;
	}
	/*
	 * A replica back up after being down: what it had cached is gone
	 * (its runner restarted) or moved, so its conversations are
	 * forgotten. While it is down they are not: a conversation whose
	 * holder is down is a spill (sluice_affinity_spills_total), and
	 * moves to where the spill sends it.
	 */
	if (ps->aff != NULL && (p->was_down & ~down) != 0)
		for (r = 0; r < nr && r < 64; r++)
			if ((p->was_down & ~down) >> r & 1) {
				sl_affinity_drop_replica(ps->aff, (uint32_t)u,
				    (int)r);
				sl_shm_hint_drop_slot(ps->shm, p->slot[r]);
			}
	p->was_down = down;
	if (nh > 0 && (ps->aff == NULL ||
	    p->conf->balance != SL_BALANCE_PREFIX_AFFINITY))
		nh = 0;
	if (nh > 0) {
		held = sl_affinity_lookup_end(ps->aff, (uint32_t)u, h, nh,
		    &matched, &ended);
		hints_lookup(ps, p, h, nh, &held, &matched, &ended);
	}
	/*
	 * A candidate's cap may fill between the look and the take (another
	 * worker): then drop it and choose again among the rest.
	 */
	while (cand != 0) {
		rr_set = 0;
		pick = nh > 0 ? choose_affine(ps, p, cand, h, held, ended, &aff) :
		    choose(ps, p, cand, &rr_set);
		if (pick < 0)
			break;
		took = sl_shm_try_acquire(ps->shm, ps->row, p->slot[pick]) ==
		    SL_ADMIT_OK;
		if (took && reused(ps, p, (size_t)pick)) {
			/* Reused meanwhile for another replica: not ours. */
			sl_shm_release(ps->shm, ps->row, p->slot[pick]);
			took = 0;
		}
		if (took) {
			rr_commit(p, rr_set, pick);
			if (nh > 0 && held >= 0 && pick != held &&
			    matched < nh) {
				/*
				 * The conversation moves (a spill), or a new
				 * one does not follow its shared prefix; that
				 * prefix (a system prompt) stays: only the
				 * blocks past what the holder had are recorded
				 * here, so new conversations still find the
				 * shared prefix where it was and a spill does
				 * not drag a whole group along (and back).
				 */
				sl_affinity_record(ps->aff, (uint32_t)u,
				    h + matched, nh - matched, pick);
				hints_record(ps, p, h + matched, nh - matched,
				    pick);
			} else if (nh > 0 && (held < 0 || pick == held)) {
				sl_affinity_record(ps->aff, (uint32_t)u, h, nh,
				    pick);
				hints_record(ps, p, h, nh, pick);
			}
			if (nh > 0 && outcome != NULL)
				*outcome = (int)aff;
			return pick;
		}
		cand &= ~(1ULL << pick);
		if (min_wait < 0 || min_wait > 1000)
			min_wait = 1000;
	}
	/* Never more than busy_max (an ejection may last 5 minutes). */
	if (min_wait > busy_max_ms(p))
		min_wait = busy_max_ms(p);
	if (min_wait > 0)
		*retry_after = (int)((min_wait + 999) / 1000);
	if (*retry_after < 1)
		*retry_after = 1;
	return -1;
}

int
sl_pool_pick(struct sl_pools *ps, size_t u, uint64_t tried, int *retry_after)
{
	return pick(ps, u, tried, NULL, 0, retry_after, NULL);
}

int
sl_pool_pick_prompt(struct sl_pools *ps, size_t u, const char *body,
    size_t len, int *retry_after, int *outcome)
{
	size_t nh = 0;

	if (u < ps->n && ps->aff != NULL &&
	    ps->p[u].conf->balance == SL_BALANCE_PREFIX_AFFINITY &&
	    body != NULL && len > 0)
		nh = sl_affinity_hashes(body, len,
		    (size_t)ps->p[u].conf->affinity.block, ps->hashes,
		    SL_POOL_MAX_BLOCKS);
	return pick(ps, u, 0, ps->hashes, nh, retry_after, outcome);
}

void
sl_pools_set_queue(struct sl_pools *ps, struct sl_queue *q,
    const size_t *pool_index)
{
	ps->q = q;
	ps->qpool = pool_index;
}

/* Upstream u waits in the fair queue: its queue pool index, else -1. */
static int64_t
queue_pool(const struct sl_pools *ps, size_t u)
{
	if (ps->q == NULL || ps->qpool == NULL || u >= ps->n ||
	    !ps->p[u].conf->queue.enabled)
		return -1;
	return (int64_t)ps->qpool[u];
}

/*
 * While u's queue has waiters: take any slot free now and hand it to the
 * best of them. A slot taken and refused goes back, and its replica is
 * not offered again by this pump: nobody waits any more, or those who
 * wait want another replica (sl_queue_enqueue_for), whose free slot must
 * not stay idle behind this one.
 */
void
sl_pool_pump(struct sl_pools *ps, size_t u)
{
	int64_t qp = queue_pool(ps, u);
	int r, wait, n = 0;
	uint64_t refused = 0;

	if (qp < 0)
		return;
	while (n++ < 64 && sl_queue_waiting(ps->q, (size_t)qp) > 0) {
		if ((r = pick(ps, u, refused, NULL, 0, &wait, NULL)) < 0)
			return;
		if (!sl_queue_offer(ps->q, ps->row, (size_t)qp, ps->p[u].slot[r],
		    sl_mono_ms())) {
			sl_shm_release(ps->shm, ps->row, ps->p[u].slot[r]);
			refused |= 1ULL << r;
		}
	}
}

/* Replica r of p is up: not down by probe, not ejected, not reused. */
static int
replica_up(const struct sl_pools *ps, const struct pool *p, size_t r,
    int64_t now)
{
	struct sl_shm_replica *h = sl_shm_replica(ps->shm, p->slot[r]);

	return h != NULL && !reused(ps, p, r) &&
	    atomic_load_explicit(&h->down, memory_order_relaxed) == 0 &&
	    atomic_load_explicit(&h->ejected_until_ms,
	    memory_order_relaxed) <= now;
}

int
sl_pool_owner(const struct sl_pools *ps, size_t u, uint64_t rid, int *up)
{
	const struct pool *p;
	size_t r;

	*up = 0;
	if (u >= ps->n)
		return -1;
	p = &ps->p[u];
	for (r = 0; r < p->conf->nreplicas && r < 64; r++)
		if (p->rid[r] == rid) {
			*up = replica_up(ps, p, r, sl_mono_ms());
			return (int)r;
		}
	return -1;
}

uint64_t
sl_pool_rid(const struct sl_pools *ps, size_t u, int r)
{
	if (u >= ps->n || r < 0 || (size_t)r >= ps->p[u].conf->nreplicas)
		return 0;
	return ps->p[u].rid[r];
}

int
sl_pool_pick_one(struct sl_pools *ps, size_t u, int r, int *retry_after)
{
	uint64_t others;

	if (u >= ps->n || r < 0 || r >= 64 ||
	    (size_t)r >= ps->p[u].conf->nreplicas) {
		*retry_after = 1;
		return -1;
	}
	others = ~(1ULL << r);
	return pick(ps, u, others, NULL, 0, retry_after, NULL);
}

int
sl_pool_queueable_one(struct sl_pools *ps, size_t u, int r)
{
	if (queue_pool(ps, u) < 0 || r < 0 || r >= 64 ||
	    (size_t)r >= ps->p[u].conf->nreplicas)
		return 0;
	return replica_up(ps, &ps->p[u], (size_t)r, sl_mono_ms());
}

int
sl_pool_queueable(struct sl_pools *ps, size_t u)
{
	struct pool *p;
	int64_t now = sl_mono_ms();
	size_t r;

	if (queue_pool(ps, u) < 0)
		return 0;
	p = &ps->p[u];
	for (r = 0; r < p->conf->nreplicas && r < 64; r++) {
		struct sl_shm_replica *h = sl_shm_replica(ps->shm, p->slot[r]);

		if (h == NULL || reused(ps, p, r) ||
		    atomic_load_explicit(&h->down, memory_order_relaxed) != 0 ||
		    atomic_load_explicit(&h->ejected_until_ms,
		    memory_order_relaxed) > now)
			continue;
		/* Up and not ejected: full (or busy) now, free later. */
		return 1;
	}
	return 0;
}

int
sl_pool_replica_of(const struct sl_pools *ps, size_t u, size_t slot)
{
	size_t r;

	if (u >= ps->n)
		return -1;
	for (r = 0; r < ps->p[u].conf->nreplicas; r++)
		if (ps->p[u].slot[r] == slot && !reused(ps, &ps->p[u], r))
			return (int)r;
	return -1;
}

/*
 * The slot of replica r is free. With waiters in u's queue it goes to the
 * next of them without being released, if r may still take a stream (up,
 * not ejected nor busy, not over a cap a reload lowered); else it goes
 * back, and then (a waiter may have come meanwhile: each side looks after
 * its own step) a free slot is taken and offered.
 */
void
sl_pool_release(struct sl_pools *ps, size_t u, int r)
{
	struct pool *p;
	struct sl_shm_replica *h;
	int64_t qp, now;
	size_t idx;

	if (u >= ps->n || r < 0 || (size_t)r >= ps->p[u].conf->nreplicas)
		return;
	p = &ps->p[u];
	idx = p->slot[r];
	if ((qp = queue_pool(ps, u)) < 0) {
		sl_shm_release(ps->shm, ps->row, idx);
		return;
	}
	if (sl_queue_waiting(ps->q, (size_t)qp) > 0) {
		now = sl_mono_ms();
		h = sl_shm_replica(ps->shm, idx);
		if (h != NULL && !reused(ps, p, (size_t)r) &&
		    atomic_load_explicit(&h->down, memory_order_relaxed) == 0 &&
		    atomic_load_explicit(&h->ejected_until_ms,
		    memory_order_relaxed) <= now &&
		    atomic_load_explicit(&h->busy_until_ms,
		    memory_order_relaxed) <= now &&
		    sl_shm_inflight(ps->shm, idx) <= sl_shm_limit(ps->shm, idx) &&
		    sl_queue_offer(ps->q, ps->row, (size_t)qp, idx, now))
			return;
	}
	sl_shm_release(ps->shm, ps->row, idx);
	if (sl_queue_waiting(ps->q, (size_t)qp) > 0)
		sl_pool_pump(ps, u);
}

const char *
sl_pool_url(const struct sl_pools *ps, size_t u, int r)
{
	if (u >= ps->n || r < 0 || (size_t)r >= ps->p[u].conf->nreplicas)
		return "";
	return ps->p[u].conf->replicas[r].url;
}

size_t
sl_pool_slot(const struct sl_pools *ps, size_t u, int r)
{
	if (u >= ps->n || r < 0 || (size_t)r >= ps->p[u].conf->nreplicas)
		return SL_TENANT_NONE(ps->shm);
	return ps->p[u].slot[r];
}

/* Replicas of the pool ejected now (for max_percent). */
static size_t
ejected_now(const struct sl_pools *ps, const struct pool *p, int64_t now)
{
	size_t r, n = 0;

	for (r = 0; r < p->conf->nreplicas; r++) {
		struct sl_shm_replica *h = sl_shm_replica(ps->shm, p->slot[r]);

		if (h != NULL && atomic_load(&h->ejected_until_ms) > now)
			n++;
	}
	return n;
}

static int pool_outcome(struct sl_pools *, size_t, int, int, int, int);

int
sl_pool_report(struct sl_pools *ps, size_t u, int r, int code,
    int retry_after_s)
{
	return pool_outcome(ps, u, r, code, retry_after_s, 1);
}

void
sl_pool_failed(struct sl_pools *ps, size_t u, int r)
{
	(void)pool_outcome(ps, u, r, SL_CODE_RESET, 0, 0);
}

static int
pool_outcome(struct sl_pools *ps, size_t u, int r, int code,
    int retry_after_s, int count)
{
	struct pool *p;
	struct sl_shm_replica *h;
	int64_t now, until, dur;
	int32_t fails, k;
	int failure;

	if (u >= ps->n || r < 0 || (size_t)r >= ps->p[u].conf->nreplicas)
		return 0;
	p = &ps->p[u];
	if (count)
		sl_shm_count_request(ps->shm, ps->row, p->slot[r], code);
	if ((h = sl_shm_replica(ps->shm, p->slot[r])) == NULL)
		return 0;
	now = sl_mono_ms();
	if ((code == 429 || code == 503) && retry_after_s > 0) {
		/*
		 * Capped at busy_max: one "Retry-After: 86400" must not take
		 * a healthy replica out for a day (a good probe clears the
		 * mark sooner, a reload too).
		 */
		int64_t b = (int64_t)retry_after_s * 1000;

		if (b > busy_max_ms(p))
			b = busy_max_ms(p);
		b += now;

		until = atomic_load(&h->busy_until_ms);
		while (until < b &&
		    !atomic_compare_exchange_weak(&h->busy_until_ms, &until, b))
			;
	}
	failure = code < 0 || code >= 500;
	if (!failure) {
		atomic_store(&h->fails, 0);
		if (atomic_load(&h->ejections) != 0 &&
		    atomic_load(&h->ejected_until_ms) <= now)
			atomic_store(&h->ejections, 0);
		return 0;
	}
	fails = atomic_fetch_add(&h->fails, 1) + 1;
	if (p->conf->eject.failures <= 0 || fails < p->conf->eject.failures)
		return 0;
	until = atomic_load(&h->ejected_until_ms);
	if (until > now)
		return 0;   /* already out */
	/* Never more of the pool out than max_percent (at least one stays). */
	if ((ejected_now(ps, p, now) + 1) * 100 >
	    (size_t)p->conf->eject.max_percent * p->conf->nreplicas)
		return 0;
	k = atomic_load(&h->ejections);
	dur = (int64_t)p->conf->eject.duration_ms;
	while (k-- > 0 && dur < EJECT_MAX_MS)
		dur *= 2;
	if (dur > EJECT_MAX_MS)
		dur = EJECT_MAX_MS;
	/* One worker wins the ejection; the others see it done. */
	if (!atomic_compare_exchange_strong(&h->ejected_until_ms, &until,
	    now + dur))
		return 0;
	atomic_fetch_add(&h->ejections, 1);
	atomic_store(&h->fails, 0);
	sl_warn("upstream %s: replica %s ejected for %lld s after %d "
	    "consecutive failures", p->conf->name, p->conf->replicas[r].url,
	    (long long)(dur / 1000), (int)fails);
	return 1;
}

/* ---- transfers: libcurl multi shards on the worker's loop ------------- */

/*
 * One libcurl multi handle and its connection cache. libcurl 7.88 walks
 * every connection of a cache when a transfer starts (to find one to
 * reuse) and when one is removed (close_connect_only): O(connections) per
 * request. Streams fill shard 0 first, then the next, SL_SHARD_STREAMS at
 * a time, so a walk is short whatever the concurrency and a light load
 * still reuses a handful of connections.
 */
#define SL_SHARD_STREAMS 32

/* Finished easy handles kept, options and all, for the next transfers. */
#define SL_EASY_POOL 128

/*
 * A shard other than the first, idle this long, is closed (its cached
 * upstream connections with it): libcurl only prunes a cache when a
 * transfer starts in it, so after a burst the shards it spilled into would
 * otherwise hold their idle connections, half-closed by the upstream, for
 * good.
 */
#define SL_SHARD_IDLE_SECONDS 10.0

#define SL_READ_MAX 16384            /* CURLOPT_BUFFERSIZE at most */

struct sl_shard {
	CURLM *multi;                /* NULL: dormant (its connections closed) */
	ev_timer timer;
	struct sl_transfers *xf;
	unsigned active;             /* transfers in this multi */
	ev_tstamp idle_since;        /* when active last dropped to 0 */
};

/*
 * Per upstream, the four possible ends of a request's header list (with or
 * without Content-Type: and Accept:), sharing nothing, never changed once
 * built.
 */
#define TAIL_LINES 4
struct header_tail {
	char *auth;                              /* "Authorization: Bearer ..." */
	struct curl_slist n[4][TAIL_LINES];      /* [have_ct << 1 | have_accept] */
};

struct sl_transfers {
	struct ev_loop *loop;
	const struct sl_config *cfg;
	struct sl_transfer_hooks hooks;
	struct header_tail *tails;   /* [cfg->nupstreams] */
	struct sl_shard *shards;     /* created on demand, never moved */
	size_t nshards, maxshards;
	/*
	 * Every shard below this index is live and full: a pick starts here,
	 * so under a steady load it looks at the shard a transfer just left,
	 * not at every shard (O(connections / SL_SHARD_STREAMS) per request).
	 */
	size_t room_from;
	size_t bufsize;              /* CURLOPT_BUFFERSIZE for every stream */
	CURLSH *share;               /* the TLS session cache of every handle */
	CURL *easy_pool[SL_EASY_POOL];   /* finished handles, ready for reuse */
	size_t neasy;
};

/* One watcher per socket libcurl asks us to poll. */
struct curl_sock {
	ev_io io;
	struct sl_shard *sh;
	curl_socket_t fd;
};

static void
check_multi_info(struct sl_shard *sh)
{
	CURLMsg *msg;
	int left;

	while ((msg = curl_multi_info_read(sh->multi, &left)) != NULL) {
		if (msg->msg != CURLMSG_DONE)
			continue;
		/* The message dies with remove_handle: copy what we need. */
		sh->xf->hooks.done(sh->xf->hooks.arg, sh, msg->easy_handle,
		    msg->data.result);
	}
}

static void
curl_action(struct sl_shard *sh, curl_socket_t fd, int ev_bitmask)
{
	int running;
	CURLMcode rc;

	rc = curl_multi_socket_action(sh->multi, fd, ev_bitmask, &running);
	if (rc != CURLM_OK)
		sl_err("curl_multi_socket_action: %s", curl_multi_strerror(rc));
	check_multi_info(sh);
}

/*
 * What one upstream read produced (often a head, some events and the last
 * chunk) goes out in one writev right away: waiting for the end of the loop
 * iteration would hold every stream's event until all the others ready in
 * the same epoll batch are read (milliseconds at thousands of streams).
 */
static void
curl_sock_cb(struct ev_loop *loop, ev_io *io, int revents)
{
	struct curl_sock *cs = io->data;
	struct sl_transfers *xf = cs->sh->xf;   /* cs may be freed by the action */
	int action = (revents & EV_READ ? CURL_CSELECT_IN : 0) |
	    (revents & EV_WRITE ? CURL_CSELECT_OUT : 0);

	curl_action(cs->sh, cs->fd, action);
	xf->hooks.flush(xf->hooks.arg);
}

static void
curl_timer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sl_shard *sh = t->data;

	curl_action(sh, CURL_SOCKET_TIMEOUT, 0);
	sh->xf->hooks.flush(sh->xf->hooks.arg);
}

/* CURLMOPT_SOCKETFUNCTION: start, change or stop polling one socket. */
static int
multi_sock_cb(CURL *e, curl_socket_t fd, int what, void *userp, void *sockp)
{
	struct sl_shard *sh = userp;
	struct ev_loop *loop = sh->xf->loop;
	struct curl_sock *cs = sockp;
	int kind;

	if (what == CURL_POLL_REMOVE) {
		if (cs != NULL) {
			ev_io_stop(loop, &cs->io);
			curl_multi_assign(sh->multi, fd, NULL);
			free(cs);
		}
		return 0;
	}
	kind = (what & CURL_POLL_IN ? EV_READ : 0) |
	    (what & CURL_POLL_OUT ? EV_WRITE : 0);
	if (cs == NULL) {
		/*
		 * A new socket: a fresh watcher (the fd number may be a reused
		 * one; its old watcher was freed on CURL_POLL_REMOVE).
		 */
		cs = calloc(1, sizeof(*cs));
		if (cs == NULL)
			return -1;
		cs->sh = sh;
		cs->fd = fd;
		curl_multi_assign(sh->multi, fd, cs);
		ev_io_init(&cs->io, curl_sock_cb, fd, kind);
		cs->io.data = cs;
		ev_io_start(loop, &cs->io);
		return 0;
	}
	if ((cs->io.events & (EV_READ | EV_WRITE)) == kind)
		return 0;
	/*
	 * Same socket, other events: ev_io_modify keeps libev from re-adding
	 * an fd epoll already has (a failing epoll_ctl per request).
	 */
	ev_io_stop(loop, &cs->io);
	ev_io_modify(&cs->io, kind);
	ev_io_start(loop, &cs->io);
	return 0;
}

/* CURLMOPT_TIMERFUNCTION: never call libcurl from here. */
static int
multi_timer_cb(CURLM *m, long timeout_ms, void *userp)
{
	struct sl_shard *sh = userp;

	ev_timer_stop(sh->xf->loop, &sh->timer);
	if (timeout_ms >= 0) {
		ev_timer_set(&sh->timer, (double)timeout_ms / 1000.0, 0.0);
		ev_timer_start(sh->xf->loop, &sh->timer);
	}
	return 0;
}

/*
 * SO_RCVBUF on every upstream socket before it connects, when configured:
 * a fixed receive buffer stops the kernel from autotuning it to tens of
 * megabytes, so a paused stream pushes back on the model runner after
 * stream_buffer + upstream_rcvbuf bytes, not after whatever tcp_rmem allows.
 */
static int
upstream_sockopt_cb(void *arg, curl_socket_t fd, curlsocktype purpose)
{
	struct sl_transfers *xf = arg;
	int v = (int)xf->cfg->limits.upstream_rcvbuf;

	if (purpose == CURLSOCKTYPE_IPCXN && v > 0 &&
	    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v)) == -1)
		sl_warn("upstream SO_RCVBUF %d: %s", v, strerror(errno));
	return CURL_SOCKOPT_OK;
}

static int
shard_init(struct sl_transfers *xf, struct sl_shard *sh)
{
	memset(sh, 0, sizeof(*sh));
	if ((sh->multi = curl_multi_init()) == NULL)
		return -1;
	sh->xf = xf;
	curl_multi_setopt(sh->multi, CURLMOPT_SOCKETFUNCTION, multi_sock_cb);
	curl_multi_setopt(sh->multi, CURLMOPT_SOCKETDATA, sh);
	curl_multi_setopt(sh->multi, CURLMOPT_TIMERFUNCTION, multi_timer_cb);
	curl_multi_setopt(sh->multi, CURLMOPT_TIMERDATA, sh);
	/*
	 * Keep an idle connection for every stream the shard may carry (and
	 * as many again for a burst that spills over): a smaller cache closes
	 * a connection per finished transfer at full load, and the next
	 * request connects again.
	 */
	curl_multi_setopt(sh->multi, CURLMOPT_MAXCONNECTS,
	    (long)(2 * SL_SHARD_STREAMS));
	ev_init(&sh->timer, curl_timer_cb);
	sh->timer.data = sh;
	sh->idle_since = ev_now(xf->loop);
	return 0;
}

/* Build upstream u's four header tails; -1 when out of memory. */
static int
header_tail_init(struct header_tail *t, const struct sl_upstream_conf *up)
{
	static char expect[] = "Expect:", ct[] = "Content-Type:",
	    accept[] = "Accept:";
	static const char bearer[] = "Authorization: Bearer ";
	int k;

	if (up->api_key != NULL) {
		size_t n = strlen(up->api_key);

		if ((t->auth = malloc(sizeof(bearer) + n)) == NULL)
			return -1;
		memcpy(t->auth, bearer, sizeof(bearer) - 1);
		memcpy(t->auth + sizeof(bearer) - 1, up->api_key, n + 1);
	}
	for (k = 0; k < 4; k++) {
		struct curl_slist *n = t->n[k];
		int i = 0;

		if (t->auth != NULL)
			n[i++].data = t->auth;
		n[i++].data = expect;
		if (!(k & 2))
			n[i++].data = ct;
		if (!(k & 1))
			n[i++].data = accept;
		while (--i > 0)
			n[i - 1].next = &n[i];
	}
	return 0;
}

struct curl_slist *
sl_transfers_header_tail(struct sl_transfers *xf, size_t u, int have_ct,
    int have_accept)
{
	if (u >= xf->cfg->nupstreams)
		return NULL;
	return xf->tails[u].n[(have_ct ? 2 : 0) | (have_accept ? 1 : 0)];
}

static void
header_tails_free(struct sl_transfers *xf)
{
	size_t u;

	for (u = 0; xf->tails != NULL && u < xf->cfg->nupstreams; u++)
		free(xf->tails[u].auth);
	free(xf->tails);
}

struct sl_transfers *
sl_transfers_new(struct ev_loop *loop, const struct sl_config *cfg,
    const struct sl_transfer_hooks *hooks)
{
	size_t u;

	struct sl_transfers *xf;

	if ((xf = calloc(1, sizeof(*xf))) == NULL)
		return NULL;
	xf->loop = loop;
	xf->cfg = cfg;
	xf->hooks = *hooks;
	if ((xf->tails = calloc(cfg->nupstreams ? cfg->nupstreams : 1,
	    sizeof(*xf->tails))) == NULL) {
		free(xf);
		return NULL;
	}
	for (u = 0; u < cfg->nupstreams; u++)
		if (header_tail_init(&xf->tails[u], &cfg->upstreams[u]) == -1) {
			header_tails_free(xf);
			free(xf);
			return NULL;
		}
	/*
	 * libcurl's receive buffer, allocated per transfer, and the one read
	 * it keeps for a paused stream: half the stream buffer, at most
	 * SL_READ_MAX. At 512 connections 4, 8 and 16 KiB gave the same
	 * req/s; at 4,096 (bench/throughput), where a whole response waits
	 * by the time it is read, 16 KiB takes it in one read where 8 needs
	 * two, each followed by libcurl's poll() for more: 0.87 -> 1.05x
	 * nginx's req/s. Only the pages a read touches count: a slow stream
	 * touches one whatever the size.
	 */
	xf->bufsize = cfg->stream_buffer / 2;
	if (xf->bufsize > SL_READ_MAX)
		xf->bufsize = SL_READ_MAX;
	if (xf->bufsize < 1024)
		xf->bufsize = 1024;
	/*
	 * Every stream the worker may carry, SL_SHARD_STREAMS per shard; the
	 * array never moves (watchers point into it), shards start on demand.
	 */
	xf->maxshards = (cfg->limits.max_connections + SL_SHARD_STREAMS - 1) /
	    SL_SHARD_STREAMS;
	/*
	 * Without a share, libcurl 7.88 gives every easy handle its own TLS
	 * session cache (5 zeroed entries, even for http://): with one per
	 * worker, a stream does not carry it, and a session resumes on any
	 * handle. Single-threaded: no lock callbacks.
	 */
	if ((xf->share = curl_share_init()) == NULL ||
	    curl_share_setopt(xf->share, CURLSHOPT_SHARE,
	    CURL_LOCK_DATA_SSL_SESSION) != CURLSHE_OK ||
	    (xf->shards = calloc(xf->maxshards, sizeof(*xf->shards))) == NULL ||
	    shard_init(xf, &xf->shards[0]) == -1) {
		free(xf->shards);
		if (xf->share != NULL)
			curl_share_cleanup(xf->share);
		header_tails_free(xf);
		free(xf);
		return NULL;
	}
	xf->nshards = 1;
	return xf;
}

void
sl_transfers_free(struct sl_transfers *xf)
{
	size_t i;

	if (xf == NULL)
		return;
	while (xf->neasy > 0)
		curl_easy_cleanup(xf->easy_pool[--xf->neasy]);
	for (i = 0; i < xf->nshards; i++) {
		if (xf->shards[i].multi == NULL)
			continue;
		ev_timer_stop(xf->loop, &xf->shards[i].timer);
		curl_multi_cleanup(xf->shards[i].multi);
	}
	free(xf->shards);
	/* Last: libcurl refuses while a handle still uses it (then it leaks). */
	curl_share_cleanup(xf->share);
	header_tails_free(xf);
	free(xf);
}

/* The shard a new transfer goes to; NULL if none can be created. */
static struct sl_shard *
shard_pick(struct sl_transfers *xf)
{
	struct sl_shard *best = NULL, *dormant = NULL, *sh;
	size_t i;

	/* The first live shard with room: a light load stays on shard 0. */
	for (i = xf->room_from; i < xf->nshards; i++) {
		sh = &xf->shards[i];
		if (sh->multi == NULL) {
			if (dormant == NULL)
				dormant = sh;
			continue;
		}
		if (sh->active < SL_SHARD_STREAMS) {
			if (dormant == NULL)
				xf->room_from = i;
			return sh;
		}
	}
	if (dormant == NULL)
		xf->room_from = xf->nshards;
	if (dormant != NULL && shard_init(xf, dormant) == 0)
		return dormant;
	if (xf->nshards < xf->maxshards &&
	    shard_init(xf, &xf->shards[xf->nshards]) == 0)
		return &xf->shards[xf->nshards++];
	/* Every shard full (max_connections reached): the least loaded. */
	for (i = 0; i < xf->nshards; i++) {
		sh = &xf->shards[i];
		if (sh->multi != NULL &&
		    (best == NULL || sh->active < best->active))
			best = sh;
	}
	return best;
}

/* Shard sh may take a transfer again: picks look from it on. */
static void
shard_has_room(struct sl_shard *sh)
{
	size_t i = (size_t)(sh - sh->xf->shards);

	if (i < sh->xf->room_from)
		sh->xf->room_from = i;
}

/* A transfer left the shard (its handle was removed from the multi). */
static void
shard_done(struct sl_shard *sh)
{
	if (sh->active > 0 && --sh->active == 0)
		sh->idle_since = ev_now(sh->xf->loop);
	shard_has_room(sh);
}

void
sl_transfers_reap(struct sl_transfers *xf)
{
	ev_tstamp now = ev_now(xf->loop);
	size_t i;

	for (i = 1; i < xf->nshards; i++) {
		struct sl_shard *sh = &xf->shards[i];

		if (sh->multi == NULL || sh->active > 0 ||
		    now - sh->idle_since < SL_SHARD_IDLE_SECONDS)
			continue;
		curl_multi_cleanup(sh->multi);
		/* After: cleanup may still have set the timer through its callback. */
		ev_timer_stop(xf->loop, &sh->timer);
		sh->multi = NULL;
		shard_has_room(sh);
	}
}

CURL *
sl_transfers_easy(struct sl_transfers *xf, int *fresh)
{
	CURL *e;

	*fresh = 0;
	if (xf->neasy > 0)
		return xf->easy_pool[--xf->neasy];
	if ((e = curl_easy_init()) == NULL)
		return NULL;
	*fresh = 1;
	curl_easy_setopt(e, CURLOPT_SHARE, xf->share);
	curl_easy_setopt(e, CURLOPT_BUFFERSIZE, (long)xf->bufsize);
	if (xf->cfg->limits.upstream_rcvbuf > 0) {
		curl_easy_setopt(e, CURLOPT_SOCKOPTFUNCTION, upstream_sockopt_cb);
		curl_easy_setopt(e, CURLOPT_SOCKOPTDATA, xf);
	}
	return e;
}

struct sl_shard *
sl_transfers_start(struct sl_transfers *xf, CURL *e)
{
	struct sl_shard *sh = shard_pick(xf);

	if (sh == NULL || curl_multi_add_handle(sh->multi, e) != CURLM_OK)
		return NULL;
	sh->active++;
	return sh;
}

void
sl_transfers_stop(struct sl_transfers *xf, struct sl_shard *sh, CURL *e)
{
	if (sh != NULL) {
		curl_multi_remove_handle(sh->multi, e);
		shard_done(sh);
	}
	/*
	 * Kept as it is: curl_easy_reset would free every option only for
	 * the next transfer to set the same again (sl_transfers_easy).
	 */
	if (xf->neasy < SL_EASY_POOL) {
		xf->easy_pool[xf->neasy++] = e;
	} else
		curl_easy_cleanup(e);
}

void
sl_transfers_discard(struct sl_transfers *xf, struct sl_shard *sh, CURL *e)
{
	(void)xf;
	if (sh != NULL) {
		curl_multi_remove_handle(sh->multi, e);
		shard_done(sh);
	}
	curl_easy_cleanup(e);
}
