/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The master never serves traffic. It opens one SO_REUSEPORT listen socket
 * per worker slot before forking (a respawned worker inherits its slot's
 * accept queue), maps the shared region, forks workers and then only waits
 * for signals and child exits, in a ppoll() loop whose signal mask closes
 * the race between checking flags and sleeping. The names it maps to
 * slots of the region are kept by slots.c; the admin listener's pages are
 * rendered by prom.c (/metrics) and status_json.c (/status.json) from
 * what the master shows them (page_in).
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "sl_admin.h"
#include "sl_auth.h"
#include "sl_cluster.h"
#include "sl_console.h"
#include "sl_h2.h"
#include "sl_log.h"
#include "sl_master.h"
#include "sl_probe.h"
#include "sl_prom.h"
#include "sl_net.h"
#include "sl_queue.h"
#include "sl_stored.h"
#include "sl_shm.h"
#include "sl_slots.h"
#include "sl_status_json.h"
#include "sl_upstream.h"
#include "sl_util.h"
#include "sl_worker.h"

/*
 * Rows of the shared region: row 0 is the master's, each worker process
 * holds one. A reload reserves a row for every worker of the new generation
 * before it retires anything, so there must be room for a full generation
 * beside a full current one; draining generations use what is left, and a
 * reload that finds too few free rows is refused (sluice.8, SIGNALS).
 */
#define MAX_ROWS (2 * SL_MAX_WORKERS + 1)
#define WORKER_ROWS (MAX_ROWS - 1)
#define RESPAWN_BACKOFF_S 1.0        /* a worker that dies young waits this */
#define LISTEN_BACKLOG 4096

struct child {
	pid_t pid;                   /* 0: free entry */
	size_t row;
	int slot;                    /* listen socket index */
	unsigned gen;
	double started;
	int draining;
};

struct master {
	const char *path;
	struct sl_gen cur;
	struct sl_shm *shm;
	struct sl_slots slots;      /* names -> slots of the region */
	struct sl_admin *admin;
	struct sl_prober *prober;    /* health probes of the current pools */
	struct sl_cluster_shm *cshm; /* `cluster:` leases; NULL: one node */
	struct sl_cluster_m *cluster;
	struct sl_queue *queue;      /* the pools' fair queue (sl_queue.h) */
	struct sl_stored *stored;    /* stored responses' replicas (sl_stored.h) */
	size_t rows_hwm;
	int *listen_fds;
	int nlisten;
	int nworkers;
	struct child children[MAX_ROWS];
	unsigned char row_used[MAX_ROWS];
	double respawn_at[SL_MAX_WORKERS];   /* 0: none pending */
	/*
	 * The row reserved for each slot of the current generation, held from
	 * the reload that created it to the next one, across a crash of the
	 * slot's worker: a respawn never competes with draining workers.
	 */
	int slot_row[SL_MAX_WORKERS];
	unsigned last_gen;           /* generation ids are never reused */
	double started;              /* sl_mono_s() at start: uptime_seconds */
	/*
	 * The console's windows (admin_listen only): the counters behind its
	 * "last minute" numbers, sampled every SL_STATUS_SAMPLE_S.
	 */
	struct sl_status_windows console;
	double next_sample;
	int stopping;                /* 1 drain, 2 quit */
	double stop_deadline;
	unsigned reloads_ok, reloads_failed;
};

/*
 * Give the pages of freed memory back: reading a configuration of
 * 100,000 tenants builds a YAML tree several times its size, freed once
 * read, and a heap that keeps those pages makes every worker forked next
 * share (and count) them. glibc only: elsewhere a no-op.
 */
static void
heap_trim(void)
{
#ifdef __GLIBC__
	malloc_trim(0);
#endif
}

static volatile sig_atomic_t got_hup, got_term, got_quit, got_chld, got_usr1;

static void
on_signal(int sig)
{
	switch (sig) {
	case SIGHUP:
		got_hup = 1;
		break;
	case SIGTERM:
	case SIGINT:
		got_term = 1;
		break;
	case SIGQUIT:
		got_quit = 1;
		break;
	case SIGCHLD:
		got_chld = 1;
		break;
	case SIGUSR1:
		got_usr1 = 1;
		break;
	}
}

static int
resolve_workers(const struct sl_config *cfg)
{
	long n;

	if (cfg->workers != SL_WORKERS_AUTO)
		return cfg->workers;
	n = sysconf(_SC_NPROCESSORS_ONLN);
	if (n < 1)
		n = 1;
	if (n > SL_MAX_WORKERS)
		n = SL_MAX_WORKERS;
	return (int)n;
}

/* ---- the region's slots, kept by slots.c --------------------------------- */

/* The oldest generation with a worker alive; UINT_MAX: none. */
static unsigned
oldest_live(const struct master *m)
{
	unsigned g = UINT_MAX;
	int i;

	for (i = 0; i < MAX_ROWS; i++)
		if (m->children[i].pid > 0 && m->children[i].gen < g)
			g = m->children[i].gen;
	return g;
}

/* What the slot maps need of the master now (sl_slots.h). */
static struct sl_slots_ctx
slots_ctx(const struct master *m)
{
	struct sl_slots_ctx c;

	c.cur = m->cur.id;
	c.oldest_live = oldest_live(m);
	c.queue = m->queue;
	c.stored = m->stored;
	c.window = m->console.window;
	c.mwindow = m->console.mwindow;
	return c;
}

/* The slot maps (sl_slots.h), told what they need of the master now. */
static size_t *
map_tenants(struct master *m, const struct sl_config *cfg, unsigned gen)
{
	struct sl_slots_ctx c = slots_ctx(m);

	return sl_slots_map_tenants(&m->slots, &c, cfg, gen);
}

static size_t **
map_replicas(struct master *m, const struct sl_config *cfg, unsigned gen)
{
	struct sl_slots_ctx c = slots_ctx(m);

	return sl_slots_map_replicas(&m->slots, &c, cfg, gen);
}

static size_t *
map_models(struct master *m, const struct sl_config *cfg, unsigned gen)
{
	struct sl_slots_ctx c = slots_ctx(m);

	return sl_slots_map_models(&m->slots, &c, cfg, gen);
}

static int
map_upstreams(struct master *m, const struct sl_config *cfg, unsigned gen,
    size_t **umapp, size_t **qmapp)
{
	struct sl_slots_ctx c = slots_ctx(m);

	return sl_slots_map_upstreams(&m->slots, &c, cfg, gen, umapp, qmapp);
}

/*
 * The fair queue follows cfg (start and reload), before the workers that
 * use it start (sl_slots_publish_queue).
 */
#define QUEUE_ENTRIES_MIN 1024
#define QUEUE_ENTRIES_MAX 65536

static void
publish_queue(struct master *m, const struct sl_config *cfg,
    const size_t *tmap, const size_t *qmap, int close_removed)
{
	struct sl_slots_ctx c = slots_ctx(m);

	sl_slots_publish_queue(&m->slots, &c, cfg, tmap, qmap, close_removed);
}

/*
 * The stored responses' table follows cfg (start and reload), by
 * upstream slot: a kept upstream keeps its ids, a lower max evicts at
 * once, a new ttl applies to every id; an upstream the reload removed
 * keeps its ids until its slot goes to another (sl_slots_map_upstreams
 * resets it then).
 */
static void
publish_stored(struct master *m, const struct sl_config *cfg,
    const size_t *umap)
{
	size_t u;

	for (u = 0; m->stored != NULL && umap != NULL && u < cfg->nupstreams; u++)
		sl_stored_set_pool(m->stored, umap[u],
		    (uint32_t)cfg->upstreams[u].response_affinity.max,
		    cfg->upstreams[u].response_affinity.ttl_ms);
}

/* ---- worker rows, children and listen sockets --------------------------- */

static int
rows_free(const struct master *m)
{
	int r, n = 0;

	for (r = 1; r < MAX_ROWS; r++)
		n += !m->row_used[r];
	return n;
}

/*
 * Reserve n worker rows into rows[], all or none: 0, or -1 (nothing
 * reserved) when fewer than n are free. Row 0 belongs to the master
 * (retired counters); workers get 1.. Release with release_row().
 */
static int
reserve_rows(struct master *m, int n, int *rows)
{
	int r, k = 0;

	if (rows_free(m) < n)
		return -1;
	for (r = 1; r < MAX_ROWS && k < n; r++)
		if (!m->row_used[r]) {
			m->row_used[r] = 1;
			rows[k++] = r;
			if ((size_t)r + 1 > m->rows_hwm) {
				m->rows_hwm = (size_t)r + 1;
				sl_shm_set_rows_used(m->shm, m->rows_hwm);
			}
		}
	return 0;
}

static void
release_row(struct master *m, int row)
{
	if (row > 0 && row < MAX_ROWS)
		m->row_used[row] = 0;
}

static int
ndraining(const struct master *m)
{
	int i, n = 0;

	for (i = 0; i < MAX_ROWS; i++)
		n += m->children[i].pid > 0 && m->children[i].draining;
	return n;
}

static struct child *
free_child(struct master *m)
{
	int i;

	for (i = 0; i < MAX_ROWS; i++)
		if (m->children[i].pid == 0)
			return &m->children[i];
	return NULL;
}

static int
spawn(struct master *m, int slot)
{
	struct sl_worker_args a;
	struct child *ch;
	int row, i, rc;
	pid_t pid, mpid;

	/* The slot's row was reserved by the reload (or start) that made it. */
	row = m->slot_row[slot];
	ch = free_child(m);
	if (ch == NULL || row <= 0 || !m->row_used[row]) {
		/* Cannot happen: children <= rows in use < MAX_ROWS. */
		sl_err("worker %d has no row; not started", slot);
		return -1;
	}
	sl_cluster_master_row_started(m->cluster, (size_t)row, 1);
	mpid = getpid();
	pid = fork();
	if (pid == -1) {
		sl_err("fork: %s", strerror(errno));
		sl_cluster_master_row_started(m->cluster, (size_t)row, 0);
		return -1;
	}
	if (pid == 0) {
		struct sigaction sa;

		/*
		 * First thing: a worker must never hold the admin socket (nor
		 * its connections), or it could accept admin connections it
		 * never serves. Nothing before this line may block.
		 */
		if (m->admin != NULL)
			sl_admin_close(m->admin);
		sl_probe_close_in_child(m->prober);
		sl_cluster_master_close_in_child(m->cluster);
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = SIG_DFL;
		sigaction(SIGHUP, &sa, NULL);
		sigaction(SIGTERM, &sa, NULL);
		sigaction(SIGINT, &sa, NULL);
		sigaction(SIGQUIT, &sa, NULL);
		sigaction(SIGCHLD, &sa, NULL);
		sigaction(SIGUSR1, &sa, NULL);
		sigaction(SIGUSR2, &sa, NULL);
		for (i = 0; i < m->nlisten; i++)
			if (i != slot)
				close(m->listen_fds[i]);
		memset(&a, 0, sizeof(a));
		a.cfg = m->cur.cfg;
		a.shm = m->shm;
		a.tenant_slot = m->cur.tenant_slot;
		a.keys = m->cur.keys;
		a.upstream_slot = m->cur.upstream_slot;
		a.queue_slot = m->cur.queue_slot;
		a.model_slot = m->cur.model_slot;
		a.replica_slot = (const size_t *const *)m->cur.replica_slot;
		a.replica_epoch = m->slots.shm_epoch;
		a.row = (size_t)row;
		a.cluster_shm = m->cshm;
		a.queue = m->queue;
		a.stored = m->stored;
		a.listen_fd = m->listen_fds[slot];
		a.index = slot;
		a.generation = m->cur.id;
		a.master_pid = mpid;
		rc = sl_worker_main(&a);
		_exit(rc);
	}
	ch->pid = pid;
	ch->row = (size_t)row;
	ch->slot = slot;
	ch->gen = m->cur.id;
	ch->started = sl_mono_s();
	ch->draining = 0;
	sl_debug("worker %d started: pid %d, row %d, generation %u", slot,
	    (int)pid, row, m->cur.id);
	return 0;
}

static void
signal_children(struct master *m, int sig, int only_old)
{
	int i;

	for (i = 0; i < MAX_ROWS; i++)
		if (m->children[i].pid > 0 &&
		    (!only_old || m->children[i].gen != m->cur.id))
			kill(m->children[i].pid, sig);
}

static int
nchildren(const struct master *m)
{
	int i, n = 0;

	for (i = 0; i < MAX_ROWS; i++)
		if (m->children[i].pid > 0)
			n++;
	return n;
}

static void
reap(struct master *m)
{
	struct { pid_t pid; int status; struct child *ch; } dead[MAX_ROWS];
	size_t rows[MAX_ROWS], n = 0, i;
	pid_t pid;
	int status, k;
	int64_t reclaimed;

	/*
	 * Collect every dead worker first, then reclaim their rows together:
	 * reconciling one dead row must not wait on another dead row.
	 */
	while (n < MAX_ROWS && (pid = waitpid(-1, &status, WNOHANG)) > 0) {
		for (k = 0; k < MAX_ROWS; k++)
			if (m->children[k].pid == pid)
				break;
		if (k == MAX_ROWS)
			continue;
		dead[n].pid = pid;
		dead[n].status = status;
		dead[n].ch = &m->children[k];
		rows[n] = m->children[k].row;
		n++;
	}
	if (n == 0)
		return;
	/* The workers are gone: their held slots go back to their tenants. */
	reclaimed = sl_shm_reclaim_rows(m->shm, rows, n);
	/* Then their waiters leave and the slots granted to them go on. */
	sl_queue_reclaim_rows(m->queue, rows, n);
	for (i = 0; i < n; i++) {
		struct child *ch = dead[i].ch;

		status = dead[i].status;
		pid = dead[i].pid;
		sl_shm_retire_stats(m->shm, ch->row);
		sl_cluster_master_reclaim_row(m->cluster, ch->row);
		if (WIFSIGNALED(status))
			sl_warn("worker %d (pid %d) killed by signal %d",
			    ch->slot, (int)pid, WTERMSIG(status));
		else if (WEXITSTATUS(status) != 0 || (!m->stopping &&
		    !ch->draining && ch->gen == m->cur.id))
			sl_warn("worker %d (pid %d) exited with status %d",
			    ch->slot, (int)pid, WEXITSTATUS(status));
		else
			sl_debug("worker %d (pid %d) exited", ch->slot, (int)pid);
		if (!m->stopping && !ch->draining && ch->gen == m->cur.id &&
		    ch->slot < m->nworkers) {
			double age = sl_mono_s() - ch->started;

			/* The row stays reserved for the replacement. */
			m->respawn_at[ch->slot] = age < RESPAWN_BACKOFF_S ?
			    sl_mono_s() + RESPAWN_BACKOFF_S : sl_mono_s();
		} else
			release_row(m, (int)ch->row);
		ch->pid = 0;
	}
	if (reclaimed > 0)
		sl_warn("%lld slot(s) held by dead worker(s) given back",
		    (long long)reclaimed);
}

static void
respawn_due(struct master *m, double *timeout)
{
	double t = sl_mono_s();
	int s;

	for (s = 0; s < m->nworkers; s++) {
		if (m->respawn_at[s] == 0)
			continue;
		if (m->respawn_at[s] <= t) {
			m->respawn_at[s] = 0;
			if (spawn(m, s) == -1)
				m->respawn_at[s] = t + RESPAWN_BACKOFF_S;
		} else if (*timeout < 0 || m->respawn_at[s] - t < *timeout)
			*timeout = m->respawn_at[s] - t;
	}
}

static int
open_listeners(struct master *m, const char *addr, int from, int to)
{
	char err[256];
	int i, *fds;

	fds = realloc(m->listen_fds, (size_t)to * sizeof(int));
	if (fds == NULL)
		return -1;
	m->listen_fds = fds;
	if (from == 0) {
		/*
		 * SO_REUSEPORT would let us bind beside another server on the
		 * same address and split its traffic. Take the address without
		 * it first, so a taken address fails here, then let it go.
		 */
		int probe = sl_net_listen(addr, 0, 1, err, sizeof(err));

		if (probe == -1) {
			sl_err("listen %s", err);
			return -1;
		}
		close(probe);
	}
	for (i = from; i < to; i++) {
		fds[i] = sl_net_listen(addr, 1, LISTEN_BACKLOG, err, sizeof(err));
		if (fds[i] == -1) {
			sl_err("listen %s", err);
			while (--i >= from)
				close(fds[i]);
			return -1;
		}
	}
	m->nlisten = to;
	return 0;
}

/* ---- reload (SIGHUP) ----------------------------------------------------- */

static void
config_warn_permissions(const char *path, const struct sl_config *cfg)
{
	char msg[PATH_MAX + 128];

	if (sl_config_permission_warning(path, msg, sizeof(msg)))
		sl_warn("%s", msg);
	if (cfg->tls.warning != NULL)
		sl_warn("%s", cfg->tls.warning);
}

/* Is a worker of generation gen alive (not yet reaped) on slot s? */
static int
slot_live(const struct master *m, unsigned gen, int s)
{
	int i;

	for (i = 0; i < MAX_ROWS; i++)
		if (m->children[i].pid > 0 && m->children[i].gen == gen &&
		    m->children[i].slot == s)
			return 1;
	return 0;
}

/*
 * Which Redis, as whom, and whether at all, are fixed for the master's
 * life (members name the node; the region is sized at start); a reload
 * takes the rest of `cluster:` (timing, on_redis_down).
 */
static void
keep_cluster(struct master *m, struct sl_config *ncfg)
{
	struct sl_cluster_conf *n = &ncfg->cluster;
	const struct sl_cluster_conf *o = &m->cur.cfg->cluster;

	if (n->enabled != o->enabled || (o->enabled && !sl_cluster_same_place(o, n))) {
		/* What is kept, as written: "sluice" alone says nothing. */
		char kept[1024];

		sl_cluster_place_str(o, kept, sizeof(kept));
		sl_warn("reload: 'cluster' redis, sentinels, master_name, "
		    "sentinel_password, password, node (or adding or removing the "
		    "section) need a restart; keeping %s", kept);
	}
	if (o->enabled && !n->enabled) {
		/*
		 * The section was removed: the running one stays whole, its
		 * timing and on_redis_down too, not the defaults of an absent
		 * section (sluice.yaml.5: the running values are kept).
		 */
		n->lease_ttl_ms = o->lease_ttl_ms;
		n->heartbeat_ms = o->heartbeat_ms;
		n->timeout_ms = o->timeout_ms;
		n->on_redis_down = o->on_redis_down;
	}
	sl_cluster_keep_place(n, o);
}

/*
 * A room limit is fixed at start: a reload that changes it is warned
 * and keeps the start value, and fails (-1) if it names more than that.
 */
static int
keep_limit(const char *key, uint64_t *val, size_t start, size_t n,
    const char *what, unsigned gen)
{
	if (*val == start)
		return 0;
	sl_warn("reload: '%s' changes need a restart; keeping %zu", key, start);
	*val = start;
	if (n <= start)
		return 0;
	sl_err("reload failed: %zu %s, %s is %zu until a restart; keeping "
	    "generation %u", n, what, key, start, gen);
	return -1;
}

/*
 * What a reload builds before it may replace the serving generation:
 * all of it is given back (reload_undo) unless the new generation starts.
 */
struct reload {
	struct sl_config *ncfg;
	struct sl_keyidx *keys;
	size_t *map, *umap, *qmap, **rmap, *mmap_;
	int rows[SL_MAX_WORKERS];
	int nw;
	int have_rows;
	int nlisten0;                /* listen sockets before the reload */
};

/* Read and validate the file apart; -1 (said why, counted) if invalid. */
static int
reload_read(struct master *m, struct reload *r)
{
	struct sl_errors errs = { NULL, 0 };
	size_t i;

	sl_info("reloading %s", m->path);
	if (sl_config_load_file_apart(m->path, &r->ncfg, &errs) == -1) {
		for (i = 0; i < errs.n; i++)
			sl_err("%s", errs.msg[i]);
		sl_err("reload failed: %zu problem(s); keeping the running "
		    "configuration", errs.n);
		sl_errors_free(&errs);
		m->reloads_failed++;
		heap_trim();
		return -1;
	}
	heap_trim();
	return 0;
}

/*
 * The key index of the new file, and what a reload cannot change (listen,
 * the cluster's identity, the room limits) set back to the running
 * values: -1 when the new file needs more room than the master has.
 */
static int
reload_keep_fixed(struct master *m, struct reload *r)
{
	struct sl_config *ncfg = r->ncfg;
	size_t nrep;

	if ((r->keys = sl_keyidx_build(ncfg)) == NULL) {
		sl_err("reload failed: cannot build the key index");
		return -1;
	}
	if (strcmp(ncfg->listen, m->cur.cfg->listen) != 0) {
		sl_warn("reload: 'listen' changes need a restart; keeping %s",
		    m->cur.cfg->listen);
		free(ncfg->listen);
		ncfg->listen = strdup(m->cur.cfg->listen);
	}
	keep_cluster(m, ncfg);
	nrep = sl_config_nreplicas(ncfg);
	if (keep_limit("limits.max_tenants", &ncfg->limits.max_tenants,
	    m->slots.max_tenants, ncfg->ntenants, "tenants", m->cur.id) == -1 ||
	    keep_limit("limits.max_models", &ncfg->limits.max_models,
	    m->slots.max_models, ncfg->nmodels, "models", m->cur.id) == -1 ||
	    keep_limit("limits.max_upstreams", &ncfg->limits.max_upstreams,
	    m->slots.max_upstreams, ncfg->nupstreams, "upstreams",
	    m->cur.id) == -1)
		return -1;
	if (nrep > m->slots.replica_room) {
		sl_err("reload failed: %zu replicas in all, at most %zu (4 per "
		    "limits.max_upstreams, at least 4096) until a restart; "
		    "keeping generation %u", nrep, m->slots.replica_room,
		    m->cur.id);
		return -1;
	}
	return 0;
}

/*
 * Worker rows and listen sockets for every worker of the new generation,
 * all or none; admin_listen kept as it runs. -1 (said why) without them.
 */
static int
reload_reserve(struct master *m, struct reload *r)
{
	struct sl_config *ncfg = r->ncfg;

	r->nw = resolve_workers(ncfg);
	/*
	 * Rows first, for every worker of the new generation: when draining
	 * workers of earlier reloads hold too many, refuse before anything
	 * changes; the current generation goes on serving.
	 */
	if (reserve_rows(m, r->nw, r->rows) == -1) {
		sl_err("reload failed: %d worker row(s) needed, %d free; %d "
		    "draining worker(s) hold the rest of the %d rows until their "
		    "streams end; keeping generation %u", r->nw, rows_free(m),
		    ndraining(m), WORKER_ROWS, m->cur.id);
		return -1;
	}
	r->have_rows = 1;
	if (r->nw > m->nlisten &&
	    open_listeners(m, ncfg->listen, m->nlisten, r->nw) == -1) {
		sl_err("reload failed: cannot open listen sockets");
		return -1;
	}
	if (ncfg->admin_listen == NULL ? m->cur.cfg->admin_listen != NULL :
	    m->cur.cfg->admin_listen == NULL ||
	    strcmp(ncfg->admin_listen, m->cur.cfg->admin_listen) != 0) {
		sl_warn("reload: 'admin_listen' changes need a restart; keeping %s",
		    m->cur.cfg->admin_listen ? m->cur.cfg->admin_listen : "none");
		free(ncfg->admin_listen);
		ncfg->admin_listen = m->cur.cfg->admin_listen ?
		    strdup(m->cur.cfg->admin_listen) : NULL;
	}
	return 0;
}

/*
 * Slots of the region for the new generation's names, and its limits
 * published; on failure (-1, said why) the running limits again.
 */
static int
reload_map(struct master *m, struct reload *r)
{
	struct sl_config *ncfg = r->ncfg;
	unsigned gen = m->last_gen + 1;

	if (map_upstreams(m, ncfg, gen, &r->umap, &r->qmap) == -1)
		r->umap = NULL;
	r->map = r->umap != NULL ? map_tenants(m, ncfg, gen) : NULL;
	if (r->map == NULL) {
		sl_err("reload failed: cannot map tenants or upstreams");
		return -1;
	}
	if ((r->rmap = map_replicas(m, ncfg, gen)) == NULL) {
		sl_err("reload failed: cannot map the upstreams' replicas");
		/* the old limits again */
		free(map_tenants(m, m->cur.cfg, m->cur.id));
		return -1;
	}
	if ((r->mmap_ = map_models(m, ncfg, gen)) == NULL) {
		sl_err("reload failed: cannot map the models");
		free(map_tenants(m, m->cur.cfg, m->cur.id));
		sl_slots_free_replica_map(map_replicas(m, m->cur.cfg, m->cur.id),
		    m->cur.cfg->nupstreams);
		return -1;
	}
	publish_queue(m, ncfg, r->map, r->qmap, 0);
	publish_stored(m, ncfg, r->umap);
	return 0;
}

/*
 * Not all of the new generation started: those that did retire (they
 * may have accepted a connection already) and the old generation, with
 * its limits, stays. The maps of r are still the caller's to free.
 */
static void
reload_roll_back(struct master *m, struct reload *r, const struct sl_gen *old,
    int old_nw, const int *old_rows, int started)
{
	int s;

	for (s = 0; s < MAX_ROWS; s++)
		if (m->children[s].pid > 0 && m->children[s].gen == m->cur.id) {
			m->children[s].draining = 1;
			kill(m->children[s].pid, SIGUSR2);
		}
	for (s = started; s < r->nw; s++)
		release_row(m, r->rows[s]);
	r->have_rows = 0;          /* the others go when their workers exit */
	m->cur = *old;
	m->nworkers = old_nw;
	memcpy(m->slot_row, old_rows, sizeof(m->slot_row));
	free(map_tenants(m, old->cfg, old->id));
	sl_slots_free_replica_map(map_replicas(m, old->cfg, old->id),
	    old->cfg->nupstreams);
	publish_queue(m, old->cfg, old->tenant_slot, old->queue_slot, 0);
	publish_stored(m, old->cfg, old->upstream_slot);
	sl_err("reload failed: cannot start worker %d of the new "
	    "generation; keeping generation %u", started, m->cur.id);
}

/*
 * The new generation runs: it takes the log level, the queue and the
 * probes; the old one retires and its rows and sockets go back.
 */
static void
reload_retire_old(struct master *m, const struct sl_gen *old, int old_nw,
    const int *old_rows)
{
	struct sl_config *ncfg = m->cur.cfg;
	int s, nw = m->nworkers;

	config_warn_permissions(m->path, ncfg);
	sl_log_set_level(ncfg->log_level);
	publish_queue(m, ncfg, m->cur.tenant_slot, m->cur.queue_slot, 1);
	publish_stored(m, ncfg, m->cur.upstream_slot);
	sl_cluster_master_reconf(m->cluster, ncfg);
	/* Rows kept for a respawn that will not happen now go back. */
	for (s = 0; s < old_nw; s++)
		if (!slot_live(m, old->id, s))
			release_row(m, old_rows[s]);
	memset(m->respawn_at, 0, sizeof(m->respawn_at));
	/*
	 * Old workers retire (SIGUSR2): they stop accepting and finish every
	 * stream they have, with no deadline, so a reload never cuts one.
	 */
	for (s = 0; s < MAX_ROWS; s++)
		if (m->children[s].pid > 0 && m->children[s].gen != m->cur.id &&
		    !m->children[s].draining) {
			m->children[s].draining = 1;
			kill(m->children[s].pid, SIGUSR2);
		}
	/*
	 * Fewer workers: a socket nobody accepts on would still receive its
	 * share of new connections from SO_REUSEPORT, so close it.
	 */
	for (s = nw; s < m->nlisten; s++)
		close(m->listen_fds[s]);
	if (nw < m->nlisten)
		m->nlisten = nw;
	/* The probes follow the pools of the new generation. */
	{
		struct sl_prober *np = sl_probe_new(ncfg, m->shm,
		    m->cur.replica_slot);

		if (np != NULL) {
			sl_probe_free(m->prober);
			m->prober = np;
		} else
			sl_err("reload: cannot set up health probes; keeping "
			    "the old ones");
	}
	/* Children hold their own copies of the old generation. */
	sl_slots_free_replica_map(old->replica_slot, old->cfg->nupstreams);
	sl_config_free(old->cfg);
	free(old->tenant_slot);
	free(old->upstream_slot);
	free(old->queue_slot);
	free(old->model_slot);
	sl_keyidx_free(old->keys);
	m->reloads_ok++;
	sl_info("reloaded: generation %u, %d worker(s), %zu tenant(s)",
	    m->cur.id, nw, ncfg->ntenants);
}

/*
 * The new generation takes over (its workers start beside the serving
 * ones, which retire once all of them run): 0, or -1 with the old one
 * back in place.
 */
static int
reload_switch(struct master *m, struct reload *r)
{
	int old_rows[SL_MAX_WORKERS];
	int s, started, old_nw;
	struct sl_gen old;

	old = m->cur;
	old_nw = m->nworkers;
	memcpy(old_rows, m->slot_row, sizeof(old_rows));
	m->cur.cfg = r->ncfg;
	m->cur.tenant_slot = r->map;
	m->cur.upstream_slot = r->umap;
	m->cur.queue_slot = r->qmap;
	m->cur.replica_slot = r->rmap;
	m->cur.model_slot = r->mmap_;
	m->cur.keys = r->keys;
	m->cur.id = ++m->last_gen;
	m->nworkers = r->nw;
	for (s = 0; s < SL_MAX_WORKERS; s++)
		m->slot_row[s] = s < r->nw ? r->rows[s] : 0;
	/* The new generation starts beside the serving one. */
	for (started = 0; started < r->nw; started++)
		if (spawn(m, started) == -1)
			break;
	if (started < r->nw) {
		reload_roll_back(m, r, &old, old_nw, old_rows, started);
		return -1;
	}
	reload_retire_old(m, &old, old_nw, old_rows);
	return 0;
}

/* A failed reload gives back what it took; the running one goes on. */
static void
reload_undo(struct master *m, struct reload *r)
{
	int s;

	/* Listen sockets opened for this reload: nobody accepts on them. */
	for (s = r->nlisten0; s < m->nlisten; s++)
		close(m->listen_fds[s]);
	m->nlisten = r->nlisten0;
	for (s = 0; r->have_rows && s < r->nw; s++)
		release_row(m, r->rows[s]);
	free(r->map);
	free(r->umap);
	free(r->qmap);
	free(r->mmap_);
	sl_keyidx_free(r->keys);
	sl_slots_free_replica_map(r->rmap, r->ncfg->nupstreams);
	sl_config_free(r->ncfg);
	m->reloads_failed++;
}

/*
 * SIGHUP: parse, validate, then swap. An invalid file changes nothing, and
 * neither does a valid one that cannot get a whole new generation (worker
 * rows, listen sockets, room in the shared region, fork): the serving
 * generation is retired only once every worker of its replacement runs.
 */
static void
reload(struct master *m)
{
	struct reload r;

	memset(&r, 0, sizeof(r));
	r.nlisten0 = m->nlisten;
	if (reload_read(m, &r) == -1)
		return;
	if (reload_keep_fixed(m, &r) == -1 || reload_reserve(m, &r) == -1 ||
	    reload_map(m, &r) == -1 || reload_switch(m, &r) == -1)
		reload_undo(m, &r);
}

/* ---- the admin listener's routes ----------------------------------------- */

static int
current_workers(const struct master *m)
{
	int i, n = 0;

	for (i = 0; i < MAX_ROWS; i++)
		if (m->children[i].pid > 0 && !m->children[i].draining &&
		    m->children[i].gen == m->cur.id)
			n++;
	return n;
}

/* What the admin pages (sl_prom.h, sl_status_json.h) read of the master. */
static void
page_in(const struct master *m, struct sl_page_in *in)
{
	in->cur = &m->cur;
	in->slots = &m->slots;
	in->queue = m->queue;
	in->cluster = m->cluster;
	in->workers = current_workers(m);
	in->reloads_ok = m->reloads_ok;
	in->reloads_failed = m->reloads_failed;
	in->started = m->started;
}

/* A lease's tenant, by shared index (the cluster renews by name). */
static const char *
shm_tenant_name(void *arg, size_t tslot)
{
	struct master *m = arg;

	if (tslot >= m->slots.shm_ntenants || m->slots.shm_replica[tslot])
		return NULL;
	return m->slots.shm_names[tslot];
}

static void
admin_handle(void *arg, const char *method, const char *path,
    struct sl_admin_resp *r)
{
	struct master *m = arg;
	const struct sl_console_asset *page = sl_console_asset(path);
	struct sl_page_in in;

	if (strcmp(path, "/healthz") != 0 && strcmp(path, "/metrics") != 0 &&
	    strcmp(path, "/status.json") != 0 && page == NULL)
		return;
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
		r->status = 405;
		sl_str_printf(&r->body, "only GET and HEAD\n");
		return;
	}
	if (strcmp(path, "/healthz") == 0) {
		r->status = m->stopping ? 503 : 200;
		sl_str_printf(&r->body, m->stopping ? "draining\n" : "ok\n");
		/* A fail mode is not unhealthy: say which, stay 200. */
		if (m->cluster != NULL)
			sl_str_printf(&r->body, "cluster: %s\n",
			    sl_cluster_mode(m->cluster));
		/* With sentinels the master moves: say where it is now. */
		if (m->cluster != NULL && m->cur.cfg->cluster.nsentinels > 0) {
			const char *a = sl_cluster_master_addr(m->cluster);

			sl_str_printf(&r->body, "cluster master: %s\n",
			    a[0] != '\0' ? a : "unknown");
		}
		return;
	}
	r->status = 200;
	if (page != NULL) {
		r->content_type = page->content_type;
		sl_str_printf(&r->body, "%.*s", (int)page->len,
		    (const char *)page->data);
	} else if (strcmp(path, "/status.json") == 0) {
		r->content_type = "application/json";
		page_in(m, &in);
		sl_status_render(&in, &m->console, sl_mono_s(), &r->body);
	} else {
		r->content_type = "text/plain; version=0.0.4; charset=utf-8";
		page_in(m, &in);
		sl_prom_render(&in, &r->body);
	}
}

/* ---- start --------------------------------------------------------------- */

/*
 * The shared region and the first generation's slots in it: 0, or -1
 * (said why, unless a map did).
 */
static int
start_region(struct master *m, struct sl_config *cfg)
{
	size_t cap;

	/*
	 * Room is reserved, not committed, here and in the region: calloc of
	 * this size maps zero pages, and an index's entries are written only
	 * once it is handed out.
	 */
	heap_trim();
	m->slots.max_tenants = (size_t)cfg->limits.max_tenants;
	m->slots.replica_room = sl_config_replica_room(cfg);
	/*
	 * The region's index space: tenants (limits.max_tenants, twice over, so
	 * that a reload may name max_tenants new ones while as many removed ones
	 * finish their streams) and pool replicas. Reserved, not committed
	 * (sl_shm.h): room costs nothing until an index is used.
	 */
	cap = 2 * m->slots.max_tenants + 2 * m->slots.replica_room;
	if (sl_slots_init_tables(&m->slots, (size_t)cfg->limits.max_models,
	    (size_t)cfg->limits.max_upstreams) == -1) {
		sl_err("cannot reserve the slot tables: %s", strerror(errno));
		return -1;
	}
	m->shm = sl_shm_create(cap, MAX_ROWS, m->slots.models.n,
	    m->slots.ups.n);
	if ((m->stored = sl_stored_create(m->slots.ups.n, SL_STORED_CAP)) ==
	    NULL) {
		sl_err("cannot map the stored responses' table: %s",
		    strerror(errno));
		return -1;
	}
	if (sl_slots_init_index(&m->slots, m->shm, cap) == -1) {
		sl_err("cannot map the shared region: %s", strerror(errno));
		return -1;
	}
	if ((m->cur.keys = sl_keyidx_build(cfg)) == NULL) {
		sl_err("cannot build the key index");
		return -1;
	}
	m->cur.tenant_slot = map_tenants(m, cfg, m->cur.id);
	if (map_upstreams(m, cfg, m->cur.id, &m->cur.upstream_slot,
	    &m->cur.queue_slot) == -1)
		m->cur.upstream_slot = NULL;
	m->cur.replica_slot = map_replicas(m, cfg, m->cur.id);
	m->cur.model_slot = map_models(m, cfg, m->cur.id);
	if (m->cur.tenant_slot == NULL || m->cur.upstream_slot == NULL ||
	    m->cur.replica_slot == NULL || m->cur.model_slot == NULL)
		return -1;
	sl_debug("shared region: %zu bytes", sl_shm_size(m->shm));
	return 0;
}

/* The pools' fair queue, sized by the queues of cfg: 0, or -1 (said why). */
static int
start_queue(struct master *m, const struct sl_config *cfg)
{
	size_t qn = 0, u;

	for (u = 0; u < cfg->nupstreams; u++)
		if (cfg->upstreams[u].queue.enabled)
			qn += (size_t)cfg->upstreams[u].queue.max;
	qn = qn < QUEUE_ENTRIES_MIN ? QUEUE_ENTRIES_MIN :
	    qn > QUEUE_ENTRIES_MAX ? QUEUE_ENTRIES_MAX : qn;
	m->queue = sl_queue_create(m->shm, SL_QUEUE_POOLS,
	    2 * m->slots.max_tenants + 2 * m->slots.replica_room, qn,
	    MAX_ROWS);
	if (m->queue == NULL) {
		sl_err("cannot map the fair queue: %s", strerror(errno));
		return -1;
	}
	publish_queue(m, cfg, m->cur.tenant_slot, m->cur.queue_slot, 0);
	publish_stored(m, cfg, m->cur.upstream_slot);
	return 0;
}

/* `cluster:`: its leases' region and the node's registration. */
static int
start_cluster(struct master *m, const struct sl_config *cfg)
{
	size_t cells = cfg->limits.max_connections;

	if (cells < 1024)
		cells = 1024;
	if (cells > SL_CLUSTER_MAX_CELLS)
		cells = SL_CLUSTER_MAX_CELLS;
	m->cshm = sl_cluster_shm_create(MAX_ROWS, cells);
	if (m->cshm == NULL || (m->cluster = sl_cluster_master_new(cfg,
	    m->cshm, shm_tenant_name, m)) == NULL) {
		sl_err("cannot set up the cluster: %s", strerror(errno));
		return -1;
	}
	/* Registered (or in on_redis_down mode) before it listens. */
	sl_cluster_master_start(m->cluster);
	return 0;
}

/* The admin listener and the console's windows: 0, or -1 (said why). */
static int
start_admin(struct master *m, const struct sl_config *cfg)
{
	char err[256];

	m->admin = sl_admin_open(cfg->admin_listen, err, sizeof(err));
	if (m->admin == NULL) {
		sl_err("admin_listen %s", err);
		return -1;
	}
	if ((m->console.window = sl_window_new(SL_STATUS_SAMPLES)) == NULL ||
	    (m->console.mwindow = sl_window_new(SL_STATUS_SAMPLES)) == NULL) {
		sl_err("cannot set up the console: %s", strerror(errno));
		return -1;
	}
	/* Every counter is 0 yet: the first minute counts from here. */
	sl_status_sample(&m->console, &m->slots, sl_mono_s());
	m->next_sample = sl_mono_s() + SL_STATUS_SAMPLE_S;
	return 0;
}

/*
 * The master's signals are blocked but while it sleeps in ppoll (with
 * *empty, the mask to sleep with), so a flag set by on_signal is never
 * missed between its check and the sleep.
 */
static void
install_signals(sigset_t *empty)
{
	struct sigaction sa;
	sigset_t block;

	sigemptyset(&block);
	sigaddset(&block, SIGHUP);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGQUIT);
	sigaddset(&block, SIGCHLD);
	sigaddset(&block, SIGUSR1);
	sigaddset(&block, SIGUSR2);   /* inherited blocked by workers */
	sigprocmask(SIG_BLOCK, &block, NULL);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGHUP, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGQUIT, &sa, NULL);
	sigaction(SIGCHLD, &sa, NULL);
	sigaction(SIGUSR1, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	signal(SIGUSR2, SIG_IGN);     /* meant for workers only */
	sigemptyset(empty);
}

/* ---- the loop ------------------------------------------------------------ */

/* Act on the signals that came since the last turn of the loop. */
static void
handle_signals(struct master *m)
{
	int s;

	if (got_chld) {
		got_chld = 0;
		reap(m);
	}
	if (got_quit && m->stopping < 2) {
		got_quit = 0;
		sl_info("SIGQUIT: exiting now");
		m->stopping = 2;
		signal_children(m, SIGQUIT, 0);
		m->stop_deadline = sl_mono_s() + 2.0;
	}
	if (got_term && !m->stopping) {
		got_term = 0;
		sl_info("shutting down: draining for up to %.1f s",
		    (double)m->cur.cfg->drain_timeout_ms / 1000.0);
		m->stopping = 1;
		signal_children(m, SIGTERM, 0);
		/*
		 * Refuse new connections at once: with every copy of the
		 * listen sockets closed, the kernel answers RST instead
		 * of queueing clients nobody will accept.
		 */
		for (s = 0; s < m->nlisten; s++)
			close(m->listen_fds[s]);
		m->nlisten = 0;
		m->stop_deadline = sl_mono_s() +
		    (double)m->cur.cfg->drain_timeout_ms / 1000.0 + 5.0;
	}
	if (got_hup) {
		got_hup = 0;
		if (!m->stopping)
			reload(m);
	}
	if (got_usr1) {
		got_usr1 = 0;
		sl_info("SIGUSR1: workers reopen the access log");
		signal_children(m, SIGUSR1, 0);
	}
}

/*
 * Stopping: 1 once every worker is gone, else the deadline (workers
 * that miss it are killed) bounds *timeout. Serving: respawns due.
 */
static int
drain_or_respawn(struct master *m, double *timeout)
{
	if (!m->stopping) {
		respawn_due(m, timeout);
		return 0;
	}
	if (nchildren(m) == 0)
		return 1;
	if (sl_mono_s() >= m->stop_deadline) {
		sl_warn("workers did not exit in time; killing them");
		signal_children(m, SIGKILL, 0);
		m->stop_deadline = sl_mono_s() + 5.0;
	}
	*timeout = m->stop_deadline - sl_mono_s();
	return 0;
}

/* *timeout becomes t when t is sooner (a negative t or *timeout: none). */
static void
sooner(double *timeout, double t)
{
	if (t >= 0 && (*timeout < 0 || t < *timeout))
		*timeout = t;
}

/*
 * The admin listener's descriptors into pfd (their count), its next
 * deadline and the console's next sample into *timeout; a sample due
 * is taken now.
 */
static int
admin_pollfds(struct master *m, struct pollfd *pfd, double *timeout)
{
	double at = sl_admin_timeout(m->admin, sl_mono_s());
	int n;

	if (sl_mono_s() >= m->next_sample) {
		sl_status_sample(&m->console, &m->slots, sl_mono_s());
		/* Late (a long reload): from now, not in a burst. */
		m->next_sample += SL_STATUS_SAMPLE_S;
		if (m->next_sample <= sl_mono_s())
			m->next_sample = sl_mono_s() + SL_STATUS_SAMPLE_S;
	}
	if (at < 0 || m->next_sample - sl_mono_s() < at)
		at = m->next_sample - sl_mono_s() > 0 ?
		    m->next_sample - sl_mono_s() : 0;

	n = sl_admin_pollfds(m->admin, pfd, SL_ADMIN_POLLFDS, sl_mono_s());
	sooner(timeout, at);
	return n;
}

/* Sleep in ppoll until a descriptor, the timeout (< 0: none) or a signal. */
static int
sleep_until(struct pollfd *pfd, int npfd, double timeout,
    const sigset_t *empty)
{
	struct timespec ts;

	if (timeout >= 0) {
		if (timeout < 0.001)
			timeout = 0.001;
		ts.tv_sec = (time_t)timeout;
		ts.tv_nsec = (long)((timeout - (double)ts.tv_sec) * 1e9);
	}
	/* Sleep with signals unblocked; flags are rechecked on wake. */
	return ppoll(npfd ? pfd : NULL, (nfds_t)npfd, timeout >= 0 ? &ts : NULL,
	    empty);
}

/*
 * The master's loop: signals, children, the admin listener, the health
 * probes and the cluster, until every worker is gone after a stop.
 * Returns the exit status.
 */
static int
run_loop(struct master *m, const sigset_t *empty)
{
	for (;;) {
		double timeout = -1;
		struct pollfd pfd[SL_ADMIN_POLLFDS + SL_PROBE_POLLFDS + 2];
		int npfd = 0, nadmin = 0, ncl = 0;

		handle_signals(m);
		if (drain_or_respawn(m, &timeout))
			return 0;
		if (m->admin != NULL)
			npfd = admin_pollfds(m, pfd, &timeout);
		nadmin = npfd;
		if (!m->stopping) {
			npfd += sl_probe_pollfds(m->prober, pfd + npfd,
			    SL_PROBE_POLLFDS);
			sooner(&timeout, sl_probe_timeout(m->prober, sl_mono_s()));
		}
		if (m->cluster != NULL) {
			/* Also while draining: leases of running streams live on. */
			ncl = sl_cluster_master_pollfds(m->cluster, pfd + npfd, 2);
			npfd += ncl;
			sooner(&timeout, sl_cluster_master_timeout(m->cluster,
			    sl_mono_s()));
		}
		if (sleep_until(pfd, npfd, timeout, empty) == -1) {
			if (errno == EINTR)
				continue;
			sl_err("ppoll: %s", strerror(errno));
			return 1;
		}
		if (m->admin != NULL)
			sl_admin_service(m->admin, pfd, nadmin, sl_mono_s(), admin_handle,
			    m);
		if (!m->stopping)
			sl_probe_service(m->prober, sl_mono_s());
		if (m->cluster != NULL)
			sl_cluster_master_service(m->cluster, pfd + npfd - ncl, ncl,
			    sl_mono_s());
	}
}

/* ---- exit ---------------------------------------------------------------- */

/* Everything the master holds, at its exit. */
static void
master_free(struct master *m)
{
	int s;

	for (s = 0; s < m->nlisten; s++)
		close(m->listen_fds[s]);
	free(m->listen_fds);
	free(m->cur.tenant_slot);
	free(m->cur.upstream_slot);
	free(m->cur.queue_slot);
	free(m->cur.model_slot);
	sl_probe_free(m->prober);
	sl_slots_free_replica_map(m->cur.replica_slot, m->cur.cfg->nupstreams);
	sl_slots_free(&m->slots);
	sl_admin_close(m->admin);
	sl_window_free(m->console.window);
	sl_window_free(m->console.mwindow);
	free(m->console.sample);
	sl_cluster_master_free(m->cluster);
	sl_cluster_shm_destroy(m->cshm);
	sl_config_free(m->cur.cfg);
	sl_keyidx_free(m->cur.keys);
	sl_queue_destroy(m->queue);
	sl_stored_destroy(m->stored);
	sl_shm_destroy(m->shm);
}

int
sl_master_run(const char *path, struct sl_config *cfg)
{
	struct master m;
	sigset_t empty;
	int s, rc;

	memset(&m, 0, sizeof(m));
	m.started = sl_mono_s();
	m.path = path;
	m.cur.cfg = cfg;
	m.cur.id = m.last_gen = 1;
	sl_log_init(cfg->log_level, "master");
	config_warn_permissions(path, cfg);

	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
		sl_err("curl_global_init failed");
		return 1;
	}
	if (start_region(&m, cfg) == -1 || start_queue(&m, cfg) == -1)
		return 1;
	if ((m.prober = sl_probe_new(cfg, m.shm, m.cur.replica_slot)) == NULL) {
		sl_err("cannot set up health probes");
		return 1;
	}
	if (cfg->cluster.enabled && start_cluster(&m, cfg) == -1)
		return 1;
	m.nworkers = resolve_workers(cfg);
	if (open_listeners(&m, cfg->listen, 0, m.nworkers) == -1)
		return 1;
	if (cfg->admin_listen != NULL && start_admin(&m, cfg) == -1)
		return 1;
	install_signals(&empty);
	if (reserve_rows(&m, m.nworkers, m.slot_row) == -1)
		return 1;
	for (s = 0; s < m.nworkers; s++)
		if (spawn(&m, s) == -1)
			return 1;
	sl_info("sluice %s listening on %s with %d worker(s), %zu tenant(s)",
	    PACKAGE_VERSION, cfg->listen, m.nworkers, cfg->ntenants);
	rc = run_loop(&m, &empty);
	sl_info("stopped");
	master_free(&m);
	curl_global_cleanup();
	return rc;
}
