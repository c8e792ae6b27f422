/*
 * Upstream pools: replica choice and what a try's outcome means for a
 * replica. See sl_upstream.h.
 */
#include "config.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sl_log.h"
#include "sl_upstream.h"

#define EJECT_MAX_MS (5 * 60 * 1000)   /* ejection backoff cap: 5 min */

struct pool {
	const struct sl_upstream_conf *conf;
	size_t *slot;                /* [nreplicas] shared index */
	int64_t *rr_current;         /* smooth weighted round robin state */
};

struct sl_pools {
	struct sl_shm *shm;
	size_t row;
	struct pool *p;
	size_t n;
	uint64_t rng;
};

int64_t
sl_mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

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

struct sl_pools *
sl_pools_new(const struct sl_config *cfg, struct sl_shm *shm, size_t row,
    const size_t *const *replica_slot)
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
		if (p->slot == NULL || p->rr_current == NULL)
			goto fail;
		for (r = 0; r < nr; r++)
			p->slot[r] = replica_slot[u][r];
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
	}
	free(ps->p);
	free(ps);
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

/* Among the candidates (bits of `cand`), the policy's choice. */
static int
choose(struct sl_pools *ps, struct pool *p, uint64_t cand)
{
	size_t nr = p->conf->nreplicas, r;
	int best = -1;

	switch (p->conf->balance) {
	case SL_BALANCE_ROUND_ROBIN: {
		/* nginx's smooth weighted round robin, per worker. */
		int64_t total = 0;

		for (r = 0; r < nr; r++) {
			if (!(cand >> r & 1))
				continue;
			p->rr_current[r] += p->conf->replicas[r].weight;
			total += p->conf->replicas[r].weight;
			if (best < 0 || p->rr_current[r] > p->rr_current[best])
				best = (int)r;
		}
		if (best >= 0)
			p->rr_current[best] -= total;
		return best;
	}
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
	default: {
		/*
		 * Lowest in-flight / weight, compared by cross-multiplying;
		 * equals are drawn at random (reservoir), so workers that see
		 * the same counts do not all herd onto the same replica.
		 */
		int64_t bl = 0, bw = 1;
		unsigned ties = 0;

		for (r = 0; r < nr; r++) {
			int64_t l, wt;

			if (!(cand >> r & 1))
				continue;
			l = sl_shm_inflight(ps->shm, p->slot[r]);
			wt = p->conf->replicas[r].weight;
			if (best < 0 || l * bw < bl * wt) {
				best = (int)r;
				bl = l;
				bw = wt;
				ties = 1;
			} else if (l * bw == bl * wt && rnd(ps) % ++ties == 0) {
				best = (int)r;
			}
		}
		return best;
	}
	}
}

int
sl_pool_pick(struct sl_pools *ps, size_t u, uint64_t tried, int *retry_after)
{
	struct pool *p;
	int64_t now, wait, min_wait = -1;
	uint64_t cand = 0;
	size_t r, nr;
	int pick;

	*retry_after = 1;
	if (u >= ps->n)
		return -1;
	p = &ps->p[u];
	nr = p->conf->nreplicas;
	now = sl_mono_ms();
	for (r = 0; r < nr && r < 64; r++) {
		if (tried >> r & 1)
			continue;
		wait = unavailable_ms(p, ps->shm, r, now);
		if (wait == 0)
			cand |= 1ULL << r;
		else if (min_wait < 0 || wait < min_wait)
			min_wait = wait;
	}
	/*
	 * A candidate's cap may fill between the look and the take (another
	 * worker): then drop it and choose again among the rest.
	 */
	while (cand != 0) {
		pick = choose(ps, p, cand);
		if (pick < 0)
			break;
		if (sl_shm_try_acquire(ps->shm, ps->row, p->slot[pick]) ==
		    SL_ADMIT_OK)
			return pick;
		cand &= ~(1ULL << pick);
		if (min_wait < 0 || min_wait > 1000)
			min_wait = 1000;
	}
	if (min_wait > 0)
		*retry_after = (int)((min_wait + 999) / 1000);
	if (*retry_after < 1)
		*retry_after = 1;
	return -1;
}

void
sl_pool_release(struct sl_pools *ps, size_t u, int r)
{
	if (u < ps->n && r >= 0 && (size_t)r < ps->p[u].conf->nreplicas)
		sl_shm_release(ps->shm, ps->row, ps->p[u].slot[r]);
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
		int64_t b = now + (int64_t)retry_after_s * 1000;

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
