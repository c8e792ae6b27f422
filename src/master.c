/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The master never serves traffic. It opens one SO_REUSEPORT listen socket
 * per worker slot before forking (a respawned worker inherits its slot's
 * accept queue), maps the shared region, forks workers and then only waits
 * for signals and child exits, in a ppoll() loop whose signal mask closes
 * the race between checking flags and sleeping.
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
#include "sl_log.h"
#include "sl_master.h"
#include "sl_probe.h"
#include "sl_net.h"
#include "sl_queue.h"
#include "sl_shm.h"
#include "sl_slots.h"
#include "sl_upstream.h"
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
/* The console's samples (console_sample). */
#define CONSOLE_SAMPLES 13
#define CONSOLE_SAMPLE_S 5.0
#define CONSOLE_SPAN_S 60.0
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
	double started;              /* now_s() at start: uptime_seconds */
	/*
	 * The console's window (admin_listen only): the counters behind its
	 * "last minute" numbers, sampled every CONSOLE_SAMPLE_S (console_sample).
	 */
	struct sl_window *window;
	struct sl_window *mwindow;   /* the models', SL_MODEL_VALUES a slot */
	double next_sample;
	uint64_t *sample;            /* scratch for a sample */
	size_t sample_cap;
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

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
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
	c.window = m->window;
	c.mwindow = m->mwindow;
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
	ch->started = now_s();
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
			double age = now_s() - ch->started;

			/* The row stays reserved for the replacement. */
			m->respawn_at[ch->slot] = age < RESPAWN_BACKOFF_S ?
			    now_s() + RESPAWN_BACKOFF_S : now_s();
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
	double t = now_s();
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
 * SIGHUP: parse, validate, then swap. An invalid file changes nothing, and
 * neither does a valid one that cannot get a whole new generation (worker
 * rows, listen sockets, room in the shared region, fork): the serving
 * generation is retired only once every worker of its replacement runs.
 */
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

	if (n->enabled != o->enabled ||
	    (o->enabled && (strcmp(n->redis, o->redis) != 0 ||
	    strcmp(n->node, o->node) != 0 ||
	    (n->password == NULL) != (o->password == NULL) ||
	    (n->password != NULL && strcmp(n->password, o->password) != 0))))
		sl_warn("reload: 'cluster' redis, password, node (or adding or "
		    "removing the section) need a restart; keeping %s",
		    o->enabled ? o->redis : "no cluster");
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
	free(n->redis);
	free(n->node);
	free(n->password);
	n->enabled = o->enabled;
	n->redis = o->redis ? strdup(o->redis) : NULL;
	n->node = o->node ? strdup(o->node) : NULL;
	n->password = o->password ? strdup(o->password) : NULL;
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

static void
reload(struct master *m)
{
	struct sl_config *ncfg = NULL;
	struct sl_errors errs = { NULL, 0 };
	size_t *map = NULL, *umap = NULL, *qmap = NULL, **rmap = NULL, *mmap_ = NULL;
	struct sl_keyidx *keys = NULL;
	size_t i, nrep;
	int rows[SL_MAX_WORKERS], old_rows[SL_MAX_WORKERS];
	int nw = 0, s, started, old_nw, have_rows = 0, nlisten0 = m->nlisten;
	struct sl_gen old;

	sl_info("reloading %s", m->path);
	if (sl_config_load_file_apart(m->path, &ncfg, &errs) == -1) {
		for (i = 0; i < errs.n; i++)
			sl_err("%s", errs.msg[i]);
		sl_err("reload failed: %zu problem(s); keeping the running "
		    "configuration", errs.n);
		sl_errors_free(&errs);
		m->reloads_failed++;
		heap_trim();
		return;
	}
	heap_trim();
	if ((keys = sl_keyidx_build(ncfg)) == NULL) {
		sl_err("reload failed: cannot build the key index");
		goto fail;
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
	    m->slots.max_upstreams, ncfg->nupstreams, "upstreams", m->cur.id) == -1)
		goto fail;
	if (nrep > m->slots.replica_room) {
		sl_err("reload failed: %zu replicas in all, at most %zu (4 per "
		    "limits.max_upstreams, at least 4096) until a restart; "
		    "keeping generation %u", nrep, m->slots.replica_room, m->cur.id);
		goto fail;
	}
	nw = resolve_workers(ncfg);
	/*
	 * Rows first, for every worker of the new generation: when draining
	 * workers of earlier reloads hold too many, refuse before anything
	 * changes; the current generation goes on serving.
	 */
	if (reserve_rows(m, nw, rows) == -1) {
		sl_err("reload failed: %d worker row(s) needed, %d free; %d "
		    "draining worker(s) hold the rest of the %d rows until their "
		    "streams end; keeping generation %u", nw, rows_free(m),
		    ndraining(m), WORKER_ROWS, m->cur.id);
		goto fail;
	}
	have_rows = 1;
	if (nw > m->nlisten && open_listeners(m, ncfg->listen, m->nlisten, nw) == -1) {
		sl_err("reload failed: cannot open listen sockets");
		goto fail;
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
	if (map_upstreams(m, ncfg, m->last_gen + 1, &umap, &qmap) == -1)
		umap = NULL;
	map = umap != NULL ? map_tenants(m, ncfg, m->last_gen + 1) : NULL;
	if (map == NULL) {
		sl_err("reload failed: cannot map tenants or upstreams");
		goto fail;
	}
	if ((rmap = map_replicas(m, ncfg, m->last_gen + 1)) == NULL) {
		sl_err("reload failed: cannot map the upstreams' replicas");
		/* the old limits again */
		free(map_tenants(m, m->cur.cfg, m->cur.id));
		goto fail;
	}
	if ((mmap_ = map_models(m, ncfg, m->last_gen + 1)) == NULL) {
		sl_err("reload failed: cannot map the models");
		free(map_tenants(m, m->cur.cfg, m->cur.id));
		sl_slots_free_replica_map(map_replicas(m, m->cur.cfg, m->cur.id),
		    m->cur.cfg->nupstreams);
		goto fail;
	}
	publish_queue(m, ncfg, map, qmap, 0);
	old = m->cur;
	old_nw = m->nworkers;
	memcpy(old_rows, m->slot_row, sizeof(old_rows));
	m->cur.cfg = ncfg;
	m->cur.tenant_slot = map;
	m->cur.upstream_slot = umap;
	m->cur.queue_slot = qmap;
	m->cur.replica_slot = rmap;
	m->cur.model_slot = mmap_;
	m->cur.keys = keys;
	m->cur.id = ++m->last_gen;
	m->nworkers = nw;
	for (s = 0; s < SL_MAX_WORKERS; s++)
		m->slot_row[s] = s < nw ? rows[s] : 0;
	/* The new generation starts beside the serving one. */
	for (started = 0; started < nw; started++)
		if (spawn(m, started) == -1)
			break;
	if (started < nw) {
		/*
		 * Not all of it: those that started retire (they may have
		 * accepted a connection already) and the old generation, with
		 * its limits, stays.
		 */
		for (s = 0; s < MAX_ROWS; s++)
			if (m->children[s].pid > 0 && m->children[s].gen == m->cur.id) {
				m->children[s].draining = 1;
				kill(m->children[s].pid, SIGUSR2);
			}
		for (s = started; s < nw; s++)
			release_row(m, rows[s]);
		have_rows = 0;          /* the others go when their workers exit */
		m->cur = old;
		m->nworkers = old_nw;
		memcpy(m->slot_row, old_rows, sizeof(old_rows));
		free(map_tenants(m, old.cfg, old.id));
		sl_slots_free_replica_map(map_replicas(m, old.cfg, old.id),
		    old.cfg->nupstreams);
		publish_queue(m, old.cfg, old.tenant_slot, old.queue_slot, 0);
		sl_err("reload failed: cannot start worker %d of the new "
		    "generation; keeping generation %u", started, m->cur.id);
		goto fail;
	}
	config_warn_permissions(m->path, ncfg);
	sl_log_set_level(ncfg->log_level);
	publish_queue(m, ncfg, map, qmap, 1);
	sl_cluster_master_reconf(m->cluster, ncfg);
	/* Rows kept for a respawn that will not happen now go back. */
	for (s = 0; s < old_nw; s++)
		if (!slot_live(m, old.id, s))
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
		struct sl_prober *np = sl_probe_new(ncfg, m->shm, rmap);

		if (np != NULL) {
			sl_probe_free(m->prober);
			m->prober = np;
		} else
			sl_err("reload: cannot set up health probes; keeping "
			    "the old ones");
	}
	/* Children hold their own copies of the old generation. */
	sl_slots_free_replica_map(old.replica_slot, old.cfg->nupstreams);
	sl_config_free(old.cfg);
	free(old.tenant_slot);
	free(old.upstream_slot);
	free(old.queue_slot);
	free(old.model_slot);
	sl_keyidx_free(old.keys);
	m->reloads_ok++;
	sl_info("reloaded: generation %u, %d worker(s), %zu tenant(s)",
	    m->cur.id, nw, ncfg->ntenants);
	return;
fail:
	/* Listen sockets opened for this reload: nobody accepts on them. */
	for (s = nlisten0; s < m->nlisten; s++)
		close(m->listen_fds[s]);
	m->nlisten = nlisten0;
	for (s = 0; have_rows && s < nw; s++)
		release_row(m, rows[s]);
	free(map);
	free(umap);
	free(qmap);
	free(mmap_);
	sl_keyidx_free(keys);
	sl_slots_free_replica_map(rmap, ncfg->nupstreams);
	sl_config_free(ncfg);
	m->reloads_failed++;
}

/* Index t is a tenant's (not a replica's, not given back). */
static int
index_is_tenant(const struct master *m, size_t t)
{
	return !m->slots.shm_replica[t] && m->slots.shm_names[t] != NULL;
}

/* Prometheus label value: escape backslash, quote and newline. */
static void
label(struct sl_str *o, const char *v)
{
	size_t n;

	/* Runs of plain bytes at once: 100,000 tenants' series are many. */
	for (;;) {
		n = strcspn(v, "\\\"\n");
		sl_str_append(o, v, n);
		v += n;
		if (*v == '\0')
			return;
		sl_str_append(o, *v == '\n' ? "\\n" : *v == '"' ? "\\\"" :
		    "\\\\", 2);
		v++;
	}
}

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

static void
render_hist(struct sl_str *o, struct sl_shm *shm, enum sl_hist h,
    const char *name, const char *help)
{
	const double *b = sl_shm_hist_bounds();
	int i;

	sl_str_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	for (i = 0; i < SL_HIST_BUCKETS; i++)
		sl_str_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, b[i],
		    (unsigned long long)sl_shm_hist_bucket(shm, h, i));
	sl_str_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n", name,
	    (unsigned long long)sl_shm_hist_bucket(shm, h, SL_HIST_BUCKETS));
	sl_str_printf(o, "%s_sum %.6f\n%s_count %llu\n", name,
	    sl_shm_hist_sum(shm, h), name,
	    (unsigned long long)sl_shm_hist_bucket(shm, h, SL_HIST_BUCKETS));
}

/*
 * One labelled series of a histogram: NAME_bucket{LABEL="V",le=...} for
 * the n bounds b and +Inf (cum: n + 1 cumulative counts), then NAME_sum
 * (printed with prec decimals) and NAME_count.
 */
#define SERIES_BUCKETS_MAX 16
_Static_assert(SL_HIST_BUCKETS <= SERIES_BUCKETS_MAX &&
    SL_MHIST_BOUNDS_MAX <= SERIES_BUCKETS_MAX, "a series' buckets fit");

static void
render_hist_series(struct sl_str *o, const char *name, const char *lname,
    const char *lvalue, const double *b, int n, const uint64_t *cum,
    double sum, int prec)
{
	int i;

	for (i = 0; i <= n; i++) {
		sl_str_printf(o, "%s_bucket{%s=\"", name, lname);
		label(o, lvalue);
		if (i < n)
			sl_str_printf(o, "\",le=\"%g\"} ", b[i]);
		else
			sl_str_printf(o, "\",le=\"+Inf\"} ");
		sl_str_printf(o, "%llu\n", (unsigned long long)cum[i]);
	}
	sl_str_printf(o, "%s_sum{%s=\"", name, lname);
	label(o, lvalue);
	sl_str_printf(o, "\"} %.*f\n%s_count{%s=\"", prec, sum, name, lname);
	label(o, lvalue);
	sl_str_printf(o, "\"} %llu\n", (unsigned long long)cum[n]);
}

/* {upstream="U",replica="URL" */
static void
replica_labels(struct sl_str *o, const char *metric, const char *up,
    const char *url)
{
	sl_str_printf(o, "%s{upstream=\"", metric);
	label(o, up);
	sl_str_printf(o, "\",replica=\"");
	label(o, url);
	sl_str_printf(o, "\"");
}

static long
value_streams(struct sl_shm *shm, size_t slot, int64_t now)
{
	(void)now;
	return sl_shm_inflight(shm, slot);
}

static long
value_up(struct sl_shm *shm, size_t slot, int64_t now)
{
	struct sl_shm_replica *h = sl_shm_replica(shm, slot);

	(void)now;
	return h != NULL && h->down == 0;
}

static long
value_busy(struct sl_shm *shm, size_t slot, int64_t now)
{
	struct sl_shm_replica *h = sl_shm_replica(shm, slot);

	return h != NULL && h->busy_until_ms > now;
}

static long
value_ejected(struct sl_shm *shm, size_t slot, int64_t now)
{
	struct sl_shm_replica *h = sl_shm_replica(shm, slot);

	return h != NULL && h->ejected_until_ms > now;
}

/*
 * The runner's own load as load_metrics last scraped it: 1 and the
 * replica's queue and KV-cache use (per mille; each -1 when its page
 * lacks it) when the upstream scrapes and the sample is fresh (4
 * intervals), else 0.
 */
static int
replica_load(struct master *m, const struct sl_upstream_conf *up,
    size_t slot, int64_t now, int32_t *waiting, int32_t *kv)
{
	struct sl_shm_replica *h = sl_shm_replica(m->shm, slot);
	int64_t at;

	if (!up->load_metrics.enabled || h == NULL)
		return 0;
	at = atomic_load(&h->lm_at_ms);
	if (at == 0 || now - at > 4 * (int64_t)up->load_metrics.interval_ms)
		return 0;
	*waiting = atomic_load(&h->lm_waiting);
	*kv = atomic_load(&h->lm_kv);
	return 1;
}

/* The runner's own load, for replicas with a fresh sample (replica_load). */
static void
replica_load_gauges(struct master *m, struct sl_str *o, int64_t now)
{
	const struct sl_config *cfg = m->cur.cfg;
	size_t u, r;
	int g;

	for (g = 0; g < 2; g++) {
		const char *name = g == 0 ? "sluice_replica_queue" :
		    "sluice_replica_kv_cache";

		sl_str_printf(o, "# HELP %s %s\n# TYPE %s gauge\n", name,
		    g == 0 ? "Requests waiting in the replica's own queue, as "
		    "its metrics page said (load_metrics)." :
		    "KV-cache use of the replica, 0 to 1, as its metrics page "
		    "said (load_metrics).", name);
		for (u = 0; u < cfg->nupstreams; u++) {
			const struct sl_upstream_conf *up = &cfg->upstreams[u];

			if (!up->load_metrics.enabled)
				continue;
			for (r = 0; r < up->nreplicas; r++) {
				int32_t waiting, kv, v;

				if (!replica_load(m, up, m->cur.replica_slot[u][r],
				    now, &waiting, &kv))
					continue;
				v = g == 0 ? waiting : kv;
				if (v < 0)
					continue;
				replica_labels(o, name, up->name,
				    up->replicas[r].url);
				if (g == 0)
					sl_str_printf(o, "} %d\n", (int)v);
				else
					sl_str_printf(o, "} %d.%03d\n",
					    (int)v / 1000, (int)v % 1000);
			}
		}
	}
}

/* One gauge per replica of the current pools. */
static void
replica_gauge(struct master *m, struct sl_str *o, const char *name,
    const char *help, long (*value)(struct sl_shm *, size_t, int64_t),
    int64_t now)
{
	const struct sl_config *cfg = m->cur.cfg;
	size_t u, r;

	sl_str_printf(o, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
	for (u = 0; u < cfg->nupstreams; u++)
		for (r = 0; r < cfg->upstreams[u].nreplicas; r++) {
			replica_labels(o, name, cfg->upstreams[u].name,
			    cfg->upstreams[u].replicas[r].url);
			sl_str_printf(o, "} %ld\n", value(m->shm,
			    m->cur.replica_slot[u][r], now));
		}
}

/*
 * Replicas a reload removed that still have streams in flight: their
 * series stays, under the URL they had, until those end (their tenants'
 * sluice_tenant_streams counts the same streams). The index is reserved
 * meanwhile (reuse_retired).
 */
static void
retired_streams(struct master *m, struct sl_str *o)
{
	const struct sl_config *cfg = m->cur.cfg;
	unsigned char *cur;
	size_t u, r, j;

	if ((cur = sl_slots_reserve(sl_shm_max_tenants(m->shm))) == NULL)
		return;
	for (u = 0; u < cfg->nupstreams; u++)
		for (r = 0; r < cfg->upstreams[u].nreplicas; r++)
			cur[m->cur.replica_slot[u][r]] = 1;
	for (j = 0; j < m->slots.shm_ntenants; j++) {
		const char *name = m->slots.shm_names[j], *url;
		int32_t n;
		char *up;

		if (!m->slots.shm_replica[j] || cur[j] || name == NULL ||
		    (n = sl_shm_inflight(m->shm, j)) <= 0 ||
		    (url = strchr(name + 1, '\x01')) == NULL)
			continue;
		/* name is "\x01UPSTREAM\x01URL" (replica_key). */
		if ((up = strndup(name + 1, (size_t)(url - name - 1))) == NULL)
			continue;
		replica_labels(o, "sluice_replica_streams", up, url + 1);
		sl_str_printf(o, "} %d\n", (int)n);
		free(up);
	}
	sl_slots_unreserve(cur, sl_shm_max_tenants(m->shm));
}

/* The pools of the current generation, replica by replica. */
static void
render_replicas(struct master *m, struct sl_str *o)
{
	const struct sl_config *cfg = m->cur.cfg;
	int64_t now = sl_mono_ms();
	size_t u, r, k;
	int c;

	replica_gauge(m, o, "sluice_replica_streams", "Streams in flight to "
	    "the replica, across all workers.", value_streams, now);
	retired_streams(m, o);
	replica_gauge(m, o, "sluice_replica_up", "1 when the replica takes "
	    "traffic by its health probes, 0 down or loading.", value_up, now);
	replica_gauge(m, o, "sluice_replica_ejected", "1 while the replica is "
	    "ejected after failures on traffic.", value_ejected, now);
	replica_gauge(m, o, "sluice_replica_busy", "1 while the replica is "
	    "marked busy by its Retry-After (at most busy_max).", value_busy,
	    now);
	replica_load_gauges(m, o, now);
	sl_str_printf(o, "# HELP sluice_replica_requests_total Tries sent to "
	    "the replica, by response status (connect, timeout, reset: none).\n"
	    "# TYPE sluice_replica_requests_total counter\n");
	for (u = 0; u < cfg->nupstreams; u++)
		for (r = 0; r < cfg->upstreams[u].nreplicas; r++)
			for (c = 0; c < SL_NCODES; c++) {
				uint64_t v = sl_shm_requests_sum(m->shm,
				    m->cur.replica_slot[u][r], c);

				if (v == 0)
					continue;
				replica_labels(o, "sluice_replica_requests_total",
				    cfg->upstreams[u].name,
				    cfg->upstreams[u].replicas[r].url);
				sl_str_printf(o, ",code=\"%s\"} %llu\n",
				    sl_shm_code_label(c), (unsigned long long)v);
			}
	sl_str_printf(o, "# HELP sluice_upstream_retries_total Requests moved "
	    "to another replica, by reason.\n"
	    "# TYPE sluice_upstream_retries_total counter\n");
	for (k = 1; k < m->slots.ups.hwm; k++)
		for (c = 0; c < SL_RETRY_R_MAX && m->slots.ups.names[k] != NULL; c++) {
			sl_str_printf(o, "sluice_upstream_retries_total{upstream=\"");
			label(o, m->slots.ups.names[k]);
			sl_str_printf(o, "\",reason=\"%s\"} %llu\n",
			    sl_shm_retry_label((enum sl_retry_reason)c),
			    (unsigned long long)sl_shm_retry_sum(m->shm, k,
			    (enum sl_retry_reason)c));
		}
	for (c = 0; c < SL_AFF_MAX; c++) {
		static const char *const an[SL_AFF_MAX] = {
			"sluice_affinity_hits_total", "sluice_affinity_misses_total",
			"sluice_affinity_spills_total"
		};
		static const char *const ah[SL_AFF_MAX] = {
			"sent to the replica holding their longest known prompt "
			"prefix",
			"whose prompt prefix no replica was known to hold",
			"not sent to the replica holding their prefix: it was "
			"overloaded (max_imbalance), down or full"
		};
		size_t j;

		sl_str_printf(o, "# HELP %s Requests of prefix_affinity "
		    "upstreams %s.\n# TYPE %s counter\n", an[c], ah[c], an[c]);
		for (j = 0; j < cfg->nupstreams; j++) {
			if (cfg->upstreams[j].balance != SL_BALANCE_PREFIX_AFFINITY)
				continue;
			k = m->cur.upstream_slot[j];   /* map_upstreams() */
			sl_str_printf(o, "%s{upstream=\"", an[c]);
			label(o, m->slots.ups.names[k]);
			sl_str_printf(o, "\"} %llu\n", (unsigned long long)
			    sl_shm_affinity_sum(m->shm, k, (enum sl_aff_outcome)c));
		}
	}
}

/* A model slot's label value: its name, "-" for slot 0. */
static const char *
model_label(const struct master *m, size_t slot)
{
	return slot == 0 || m->slots.models.names[slot] == NULL ? "-" :
	    m->slots.models.names[slot];
}

/* A tenant x model pair of the token table, for sorting. */
struct tok_pair {
	size_t tenant, model;
	uint64_t n[SL_TOKENS_KINDS];
};

static int
tok_pair_cmp(const void *a, const void *b)
{
	const struct tok_pair *x = a, *y = b;

	if (x->tenant != y->tenant)
		return x->tenant < y->tenant ? -1 : 1;
	return x->model < y->model ? -1 : x->model > y->model;
}

/* The table's pairs, sorted by tenant and model (caller frees); *n. */
static struct tok_pair *
tok_pairs(struct master *m, size_t *n)
{
	struct tok_pair *v = NULL, *nv;
	size_t pos = 0, cap = 0;
	struct tok_pair p;

	*n = 0;
	while (sl_shm_tokens_next(m->shm, &pos, &p.tenant, &p.model, p.n)) {
		if (*n == cap) {
			cap = cap ? 2 * cap : 64;
			if ((nv = realloc(v, cap * sizeof(*v))) == NULL)
				break;   /* what fits is shown */
			v = nv;
		}
		v[(*n)++] = p;
	}
	if (*n > 1)
		qsort(v, *n, sizeof(*v), tok_pair_cmp);
	return v;
}

/*
 * The fair queue of each pool that has one (sl_queue.h): waiters per
 * tenant, outcomes, and the tenants' service counters, in tokens.
 */
static void
render_queue(struct master *m, struct sl_str *o)
{
	const struct sl_config *cfg = m->cur.cfg;
	size_t u, t, k;

	sl_str_printf(o, "# HELP sluice_queue_waiting Requests waiting in the "
	    "pool's fair queue, per tenant, all workers.\n"
	    "# TYPE sluice_queue_waiting gauge\n");
	for (u = 0; u < cfg->nupstreams; u++) {
		if (!cfg->upstreams[u].queue.enabled)
			continue;
		for (t = 0; t < cfg->ntenants; t++) {
			sl_str_printf(o, "sluice_queue_waiting{upstream=\"");
			label(o, cfg->upstreams[u].name);
			sl_str_printf(o, "\",tenant=\"");
			label(o, cfg->tenants[t].name);
			sl_str_printf(o, "\"} %d\n", (int)sl_queue_waiting_tenant(
			    m->queue, m->cur.queue_slot[u], m->cur.tenant_slot[t]));
		}
	}
	sl_str_printf(o, "# HELP sluice_queue_total Requests that met a full "
	    "pool with a queue, by outcome.\n"
	    "# TYPE sluice_queue_total counter\n");
	for (u = 0; u < cfg->nupstreams; u++) {
		if (!cfg->upstreams[u].queue.enabled)
			continue;
		for (k = 0; k < SL_QUEUE_O_MAX; k++) {
			sl_str_printf(o, "sluice_queue_total{upstream=\"");
			label(o, cfg->upstreams[u].name);
			sl_str_printf(o, "\",outcome=\"%s\"} %llu\n",
			    sl_queue_outcome_label((enum sl_queue_outcome)k),
			    (unsigned long long)sl_queue_outcomes(m->queue,
			    m->cur.queue_slot[u], (enum sl_queue_outcome)k));
		}
	}
	sl_str_printf(o, "# HELP sluice_queue_wait_seconds Time a request "
	    "dispatched from the pool's queue waited there.\n"
	    "# TYPE sluice_queue_wait_seconds histogram\n");
	for (u = 0; u < cfg->nupstreams; u++) {
		size_t qp = m->cur.queue_slot[u];
		uint64_t cum[SERIES_BUCKETS_MAX + 1];
		int i;

		if (!cfg->upstreams[u].queue.enabled)
			continue;
		for (i = 0; i <= SL_HIST_BUCKETS; i++)
			cum[i] = sl_queue_wait_bucket(m->queue, qp, i);
		render_hist_series(o, "sluice_queue_wait_seconds", "upstream",
		    cfg->upstreams[u].name, sl_shm_hist_bounds(), SL_HIST_BUCKETS,
		    cum, (double)sl_queue_wait_ms_sum(m->queue, qp) / 1000.0, 3);
	}
	sl_str_printf(o, "# HELP sluice_tenant_service The tenant's service "
	    "counter in the pool's queue: (prompt + 2 x completion tokens) / "
	    "weight.\n"
	    "# TYPE sluice_tenant_service counter\n");
	for (u = 0; u < cfg->nupstreams; u++) {
		if (!cfg->upstreams[u].queue.enabled)
			continue;
		for (t = 0; t < cfg->ntenants; t++) {
			uint64_t v = sl_queue_service(m->queue,
			    m->cur.queue_slot[u], m->cur.tenant_slot[t]);

			sl_str_printf(o, "sluice_tenant_service{upstream=\"");
			label(o, cfg->upstreams[u].name);
			sl_str_printf(o, "\",tenant=\"");
			label(o, cfg->tenants[t].name);
			sl_str_printf(o, "\"} %llu.%03u\n",
			    (unsigned long long)(v / 1000), (unsigned)(v % 1000));
		}
	}
}

static void
tok_line(struct master *m, struct sl_str *o, size_t t, size_t model,
    int kind, uint64_t v)
{
	static const char *const kinds[SL_TOKENS_KINDS] = {
		"prompt", "completion", "estimated"
	};

	sl_str_printf(o, "sluice_tenant_tokens_total{tenant=\"");
	label(o, m->slots.shm_names[t]);
	sl_str_printf(o, "\",model=\"");
	label(o, model_label(m, model));
	sl_str_printf(o, "\",kind=\"%s\"} %llu\n", kinds[kind],
	    (unsigned long long)v);
}

/* Tokens per tenant and model, read from responses (usage). */
static void
render_tokens(struct master *m, struct sl_str *o)
{
	struct timespec ts;
	struct tok_pair *pairs;
	size_t t, np, i = 0;
	int k;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	pairs = tok_pairs(m, &np);
	sl_str_printf(o, "# HELP sluice_tenant_tokens_total Tokens used per "
	    "tenant and model (\"-\": not routed by model): prompt and "
	    "completion as reported by the runner, estimated where no usage "
	    "arrived.\n"
	    "# TYPE sluice_tenant_tokens_total counter\n");
	for (t = 0; t < m->slots.shm_ntenants; t++) {
		if (!index_is_tenant(m, t))
			continue;
		for (k = 0; k < SL_TOKENS_KINDS; k++)
			tok_line(m, o, t, 0, k, sl_shm_tokens_model(m->shm, t, 0, k));
		for (; i < np && pairs[i].tenant < t; i++)
			;
		for (; i < np && pairs[i].tenant == t; i++)
			for (k = 0; k < SL_TOKENS_KINDS; k++)
				tok_line(m, o, t, pairs[i].model, k, pairs[i].n[k]);
	}
	free(pairs);
	sl_str_printf(o, "# HELP sluice_tenant_tokens_window Tokens charged to "
	    "the tenant in the last 60 s (what tokens_per_minute bounds).\n"
	    "# TYPE sluice_tenant_tokens_window gauge\n");
	for (t = 0; t < m->slots.shm_ntenants; t++) {
		if (!index_is_tenant(m, t))
			continue;
		sl_str_printf(o, "sluice_tenant_tokens_window{tenant=\"");
		label(o, m->slots.shm_names[t]);
		sl_str_printf(o, "\"} %llu\n", (unsigned long long)
		    sl_shm_tokens_window(m->shm, t, (uint64_t)ts.tv_sec, 0, NULL));
	}
}

/* Slots worth showing: "-" and every slot that has had a name. */
static int
model_shown(const struct master *m, size_t slot)
{
	return slot == 0 || (slot < m->slots.models.hwm && m->slots.models.names[slot] != NULL);
}

#define OTHER_MODELS "_other"

static void
render_model_hist(struct master *m, struct sl_str *o, enum sl_mhist h,
    const char *name, const char *help)
{
	uint64_t cum[SERIES_BUCKETS_MAX + 1];
	const double *b;
	size_t j;
	int i, n;

	uint64_t rest[SERIES_BUCKETS_MAX + 1];
	double rest_sum;
	size_t k;

	b = sl_shm_mhist_bounds(h, &n);
	sl_str_printf(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	/*
	 * "-" and the first SL_MODEL_HIST_SERIES slots under their own model's
	 * label; the others summed under OTHER_MODELS, with what the slots
	 * given to other names had counted (other_hist), so that the sum
	 * never goes back.
	 */
	for (k = 0; k <= (size_t)n; k++)
		rest[k] = m->slots.other_hist[h][k];
	rest_sum = (double)m->slots.other_hist_us[h] / 1e6;
	for (j = 0; j < m->slots.models.hwm; j++) {
		if (!model_shown(m, j))
			continue;
		for (i = 0; i <= n; i++)
			cum[i] = sl_shm_model_hist_bucket(m->shm, j, h, i);
		if (j > SL_MODEL_HIST_SERIES) {
			for (k = 0; k <= (size_t)n; k++)
				rest[k] += cum[k];
			rest_sum += sl_shm_model_hist_sum(m->shm, j, h);
			continue;
		}
		render_hist_series(o, name, "model", model_label(m, j), b, n, cum,
		    sl_shm_model_hist_sum(m->shm, j, h), 6);
	}
	if (m->slots.models.hwm > SL_MODEL_HIST_SERIES + 1)
		render_hist_series(o, name, "model", OTHER_MODELS, b, n, rest,
		    rest_sum, 6);
}

/* Per model (issue 23): requests, fallbacks, latencies. */
static void
render_models(struct master *m, struct sl_str *o)
{
	size_t j, k, pos;
	uint64_t v;
	int c;

	sl_str_printf(o, "# HELP sluice_model_requests_total Requests answered, "
	    "by the model that answered (\"-\": none named, an unknown one, or "
	    "no models:) and status.\n"
	    "# TYPE sluice_model_requests_total counter\n");
	for (j = 0; j < m->slots.models.hwm; j++) {
		if (!model_shown(m, j))
			continue;
		for (c = 0; c < SL_NCODES; c++) {
			if ((v = sl_shm_model_requests_sum(m->shm, j, c)) == 0)
				continue;
			sl_str_printf(o, "sluice_model_requests_total{model=\"");
			label(o, model_label(m, j));
			sl_str_printf(o, "\",code=\"%s\"} %llu\n",
			    sl_shm_code_label(c), (unsigned long long)v);
		}
	}
	sl_str_printf(o, "# HELP sluice_model_fallbacks_total Requests moved "
	    "from one model to a fallback model (to the same model: to another "
	    "of its targets).\n"
	    "# TYPE sluice_model_fallbacks_total counter\n");
	for (pos = 0; sl_shm_fallbacks_next(m->shm, &pos, &j, &k, &v);) {
		if (!model_shown(m, j) || !model_shown(m, k))
			continue;
		sl_str_printf(o, "sluice_model_fallbacks_total{model=\"");
		label(o, model_label(m, j));
		sl_str_printf(o, "\",to=\"");
		label(o, model_label(m, k));
		sl_str_printf(o, "\"} %llu\n", (unsigned long long)v);
	}
	render_model_hist(m, o, SL_MHIST_TTFT,
	    "sluice_time_to_first_token_seconds", "Time from request head to "
	    "the first relayed content: an event carrying content, or the "
	    "first body byte (successful responses).");
	render_model_hist(m, o, SL_MHIST_TPOT,
	    "sluice_time_per_output_token_seconds", "(duration - time to first "
	    "token) / (completion tokens - 1), for successful event streams of "
	    "2 completion tokens or more.");
	render_model_hist(m, o, SL_MHIST_DURATION,
	    "sluice_request_duration_seconds", "Time from request head to the "
	    "end of the relayed response.");
}

static const char *
tls_reason(int k)
{
	return sl_tls_err_name((enum sl_tls_err)k);
}

static const char *
h2_reason(int k)
{
	return sl_h2_err_name((enum sl_h2_err)k);
}

/* A counter family by reason: n per-worker stats from first, summed. */
static void
render_reasons(struct sl_str *o, struct sl_shm *shm, const char *name,
    const char *help, int first, int n, const char *(*reason)(int))
{
	int k;

	sl_str_printf(o, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
	for (k = 0; k < n; k++)
		sl_str_printf(o, "%s{reason=\"%s\"} %llu\n", name, reason(k),
		    (unsigned long long)sl_shm_stat_sum(shm,
		    (enum sl_stat)(first + k)));
}

static void
render_metrics(struct master *m, struct sl_str *o)
{
	struct sl_shm *shm = m->shm;
	size_t t, u;
	int c, k;

	sl_str_printf(o, "# HELP sluice_tenant_streams Requests in flight per "
	    "tenant, across all workers.\n# TYPE sluice_tenant_streams gauge\n");
	for (t = 0; t < m->slots.shm_ntenants; t++) {
		if (!index_is_tenant(m, t))
			continue;
		sl_str_printf(o, "sluice_tenant_streams{tenant=\"");
		label(o, m->slots.shm_names[t]);
		sl_str_printf(o, "\"} %d\n", (int)sl_shm_inflight(shm, t));
	}
	sl_str_printf(o, "# HELP sluice_tenant_max_streams Configured limit per "
	    "tenant (0: retired).\n# TYPE sluice_tenant_max_streams gauge\n");
	for (t = 0; t < m->slots.shm_ntenants; t++) {
		if (!index_is_tenant(m, t))
			continue;
		sl_str_printf(o, "sluice_tenant_max_streams{tenant=\"");
		label(o, m->slots.shm_names[t]);
		sl_str_printf(o, "\"} %d\n", (int)sl_shm_limit(shm, t));
	}
	sl_str_printf(o, "# HELP sluice_requests_total Requests answered, by "
	    "tenant and status.\n# TYPE sluice_requests_total counter\n");
	for (t = 0; t <= m->slots.shm_ntenants; t++) {
		size_t ti = t < m->slots.shm_ntenants ? t : SL_TENANT_NONE(shm);

		if (t < m->slots.shm_ntenants && !index_is_tenant(m, t))
			continue;

		for (c = 0; c < SL_NCODES; c++) {
			uint64_t v = sl_shm_requests_sum(shm, ti, c);

			if (v == 0)
				continue;
			sl_str_printf(o, "sluice_requests_total{tenant=\"");
			label(o, t < m->slots.shm_ntenants ? m->slots.shm_names[t] : "-");
			sl_str_printf(o, "\",code=\"%s\"} %llu\n",
			    sl_shm_code_label(c), (unsigned long long)v);
		}
	}
	sl_str_printf(o, "# HELP sluice_rejected_total Requests refused by "
	    "admission.\n# TYPE sluice_rejected_total counter\n");
	for (t = 0; t < m->slots.shm_ntenants; t++) {
		if (!index_is_tenant(m, t))
			continue;
		sl_str_printf(o, "sluice_rejected_total{tenant=\"");
		label(o, m->slots.shm_names[t]);
		sl_str_printf(o, "\",reason=\"max_streams\"} %llu\n",
		    (unsigned long long)sl_shm_rejected_sum(shm, t,
		    SL_REJECT_MAX_STREAMS));
		sl_str_printf(o, "sluice_rejected_total{tenant=\"");
		label(o, m->slots.shm_names[t]);
		sl_str_printf(o, "\",reason=\"token_budget\"} %llu\n",
		    (unsigned long long)sl_shm_rejected_sum(shm, t,
		    SL_REJECT_TOKEN_BUDGET));
	}
	sl_str_printf(o, "# HELP sluice_upstream_errors_total Upstream failures "
	    "by kind.\n# TYPE sluice_upstream_errors_total counter\n");
	for (u = 1; u < m->slots.ups.hwm; u++)
		for (k = 0; k < SL_UERR_MAX && m->slots.ups.names[u] != NULL; k++) {
			sl_str_printf(o, "sluice_upstream_errors_total{upstream=\"");
			label(o, m->slots.ups.names[u]);
			sl_str_printf(o, "\",kind=\"%s\"} %llu\n",
			    sl_shm_uerr_label((enum sl_uerr)k),
			    (unsigned long long)sl_shm_uerr_sum(shm, u,
			    (enum sl_uerr)k));
		}
	sl_str_printf(o,
	    "# HELP sluice_upstream_paused_streams Streams whose upstream is "
	    "paused because the client is slow.\n"
	    "# TYPE sluice_upstream_paused_streams gauge\n"
	    "sluice_upstream_paused_streams %llu\n"
	    "# HELP sluice_stream_buffer_bytes Response bytes waiting for "
	    "clients in stream buffers.\n"
	    "# TYPE sluice_stream_buffer_bytes gauge\n"
	    "sluice_stream_buffer_bytes %llu\n"
	    "# HELP sluice_connections Open client connections by protocol.\n"
	    "# TYPE sluice_connections gauge\n"
	    "sluice_connections{proto=\"h1\"} %llu\n"
	    "sluice_connections{proto=\"h2\"} %llu\n"
	    "# HELP sluice_h2_streams Open HTTP/2 streams with a request.\n"
	    "# TYPE sluice_h2_streams gauge\nsluice_h2_streams %llu\n"
	    "# HELP sluice_upstream_streams Upstream transfers in progress.\n"
	    "# TYPE sluice_upstream_streams gauge\nsluice_upstream_streams %llu\n"
	    "# HELP sluice_admitted_total Requests admitted.\n"
	    "# TYPE sluice_admitted_total counter\nsluice_admitted_total %llu\n"
	    "# HELP sluice_upstream_pauses_total Times a stream's upstream was "
	    "paused.\n# TYPE sluice_upstream_pauses_total counter\n"
	    "sluice_upstream_pauses_total %llu\n"
	    "# HELP sluice_idle_connections_closed_total Connections closed "
	    "after sending no request byte within timeouts.client_header "
	    "(preconnects); not requests.\n"
	    "# TYPE sluice_idle_connections_closed_total counter\n"
	    "sluice_idle_connections_closed_total %llu\n"
	    "# HELP sluice_bytes_out_total Bytes written to clients.\n"
	    "# TYPE sluice_bytes_out_total counter\nsluice_bytes_out_total %llu\n"
	    "# HELP sluice_workers Worker processes of the current generation.\n"
	    "# TYPE sluice_workers gauge\nsluice_workers %d\n"
	    "# HELP sluice_reloads_total Configuration reloads by result.\n"
	    "# TYPE sluice_reloads_total counter\n"
	    "sluice_reloads_total{result=\"ok\"} %u\n"
	    "sluice_reloads_total{result=\"failed\"} %u\n",
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_PAUSED_STREAMS),
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_BUFFERED_BYTES),
	    (unsigned long long)(sl_shm_stat_sum(shm, SL_STAT_CONNECTIONS) -
	    sl_shm_stat_sum(shm, SL_STAT_H2_CONNECTIONS)),
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_H2_CONNECTIONS),
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_H2_STREAMS),
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_STREAMS),
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_ADMITTED),
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_PAUSES),
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_IDLE_CLOSED),
	    (unsigned long long)sl_shm_stat_sum(shm, SL_STAT_BYTES_OUT),
	    current_workers(m), m->reloads_ok, m->reloads_failed);
	render_reasons(o, shm, "sluice_tls_handshake_errors_total", "TLS "
	    "handshakes that failed, by reason; no request was read.",
	    SL_STAT_TLS_ERR_FIRST, SL_TLS_E_MAX, tls_reason);
	render_reasons(o, shm, "sluice_h2_protocol_errors_total", "HTTP/2 "
	    "connections or streams ended by the protocol's rules, by reason.",
	    SL_STAT_H2_ERR_FIRST, SL_H2_E_MAX, h2_reason);
	render_tokens(m, o);
	render_models(m, o);
	render_queue(m, o);
	render_replicas(m, o);
	render_hist(o, shm, SL_HIST_TTFB, "sluice_ttfb_seconds",
	    "Time from request head to the upstream's response head.");
	render_hist(o, shm, SL_HIST_DURATION, "sluice_stream_duration_seconds",
	    "Time from request head to the end of the relayed response.");
	if (m->cluster != NULL)
		sl_cluster_render(m->cluster, o);
}

/*
 * The console (sluice.8, ADMIN ENDPOINTS): /status.json is read from the
 * shared region like /metrics, by the same readers, and costs O(tenants
 * + replicas) (a tenant's waiters: once per pool with a queue, at most
 * SL_SHM_MAX_UPSTREAMS). Its "last minute" numbers are the counters now
 * minus the oldest sample of them taken within the last minute: the loop
 * samples them every CONSOLE_SAMPLE_S (5 s) into a window of
 * CONSOLE_SAMPLES, 32 bits a counter (sl_console.h), so a tenant's two
 * counters cost 104 bytes of samples. Two windows: `window` samples
 * SL_INDEX_VALUES per shared index handed out (tenants and replicas),
 * `mwindow` SL_MODEL_VALUES per model slot handed out.
 */

/* A status slot that is a replica's failure: 5xx, or no status at all. */
static int
code_is_error(int slot)
{
	const char *l = sl_shm_code_label(slot);

	return l[0] == '5' || l[0] < '0' || l[0] > '9';
}

/*
 * The counters of shared index j: a tenant's refusals by admission (429
 * at max_streams or tokens_per_minute); a replica's tries and its failed
 * ones (code_is_error).
 */
static void
index_counters(struct master *m, size_t j, uint64_t v[SL_INDEX_VALUES])
{
	int c;

	v[0] = v[1] = 0;
	if (!m->slots.shm_replica[j]) {
		for (c = 0; c < SL_REJECT_MAX; c++)
			v[0] += sl_shm_rejected_sum(m->shm, j,
			    (enum sl_reject_reason)c);
		return;
	}
	for (c = 0; c < SL_NCODES; c++) {
		uint64_t n = sl_shm_requests_sum(m->shm, j, c);

		v[0] += n;
		if (code_is_error(c))
			v[1] += n;
	}
}

/* Requests answered under model slot `slot`, then its TTFT buckets. */
static void
model_counters(struct master *m, size_t slot, uint64_t v[SL_MODEL_VALUES])
{
	int c, i, n;

	memset(v, 0, SL_MODEL_VALUES * sizeof(*v));
	sl_shm_mhist_bounds(SL_MHIST_TTFT, &n);
	for (c = 0; c < SL_NCODES; c++)
		v[0] += sl_shm_model_requests_sum(m->shm, slot, c);
	for (i = 0; i <= n; i++)
		v[1 + i] = sl_shm_model_hist_bucket(m->shm, slot, SL_MHIST_TTFT, i);
}

/* Take the console's sample of now (the loop, every CONSOLE_SAMPLE_S). */
static void
console_sample(struct master *m, double now)
{
	size_t n = m->slots.shm_ntenants * SL_INDEX_VALUES, j;

	if (m->slots.models.hwm * SL_MODEL_VALUES > n)
		n = m->slots.models.hwm * SL_MODEL_VALUES;
	if (n > m->sample_cap) {
		uint64_t *ns = realloc(m->sample, n * sizeof(*ns));

		if (ns == NULL)
			return;         /* the next second tries again */
		m->sample = ns;
		m->sample_cap = n;
	}
	n = m->slots.models.hwm * SL_MODEL_VALUES;
	memset(m->sample, 0, n * sizeof(*m->sample));
	for (j = 1; j < m->slots.models.hwm; j++)
		if (m->slots.models.names[j] != NULL)
			model_counters(m, j, m->sample + j * SL_MODEL_VALUES);
	sl_window_push(m->mwindow, now, m->sample, n);
	n = m->slots.shm_ntenants * SL_INDEX_VALUES;
	memset(m->sample, 0, n * sizeof(*m->sample));
	for (j = 0; j < m->slots.shm_ntenants; j++)
		if (m->slots.shm_names[j] != NULL)
			index_counters(m, j,
			    m->sample + j * SL_INDEX_VALUES);
	sl_window_push(m->window, now, m->sample, n);
}

struct since {                   /* the sample a minute ago */
	const uint32_t *v;
	size_t n;
};

static uint64_t
last_minute(const struct since *b, size_t i, uint64_t cur)
{
	return sl_window_delta(b->v, b->n, i, cur);
}

static void
status_tenants(struct master *m, struct sl_str *o, const struct since *b)
{
	const struct sl_config *cfg = m->cur.cfg;
	struct timespec ts;
	size_t t, u;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	sl_str_printf(o, "\"tenants\":[");
	for (t = 0; t < cfg->ntenants; t++) {
		const struct sl_tenant_conf *tc = &cfg->tenants[t];
		size_t j = m->cur.tenant_slot[t];
		uint64_t v[SL_INDEX_VALUES];
		long waiting = 0;

		index_counters(m, j, v);
		for (u = 0; u < cfg->nupstreams; u++)
			if (cfg->upstreams[u].queue.enabled)
				waiting += sl_queue_waiting_tenant(m->queue,
				    m->cur.queue_slot[u], j);
		sl_str_printf(o, "%s{\"name\":", t > 0 ? "," : "");
		sl_console_json_str(o, tc->name);
		sl_str_printf(o, ",\"streams\":%d,\"max_streams\":%d,"
		    "\"waiting\":%ld,\"tokens_last_minute\":%llu,"
		    "\"tokens_per_minute\":",
		    (int)sl_shm_inflight(m->shm, j), (int)sl_shm_limit(m->shm, j),
		    waiting, (unsigned long long)sl_shm_tokens_window(m->shm, j,
		    (uint64_t)ts.tv_sec, 0, NULL));
		if (tc->tokens_per_minute > 0)
			sl_str_printf(o, "%d", (int)tc->tokens_per_minute);
		else
			sl_str_printf(o, "null");
		sl_str_printf(o, ",\"rejected_last_minute\":%llu}",
		    (unsigned long long)last_minute(b,
		    j * SL_INDEX_VALUES, v[0]));
	}
	sl_str_printf(o, "]");
}

static void
status_replica(struct master *m, struct sl_str *o, const struct since *b,
    size_t u, size_t r, int64_t now)
{
	const struct sl_upstream_conf *up = &m->cur.cfg->upstreams[u];
	size_t j = m->cur.replica_slot[u][r];
	uint64_t v[SL_INDEX_VALUES];
	int32_t waiting = -1, kv = -1;

	index_counters(m, j, v);
	replica_load(m, up, j, now, &waiting, &kv);
	sl_str_printf(o, "%s{\"url\":", r > 0 ? "," : "");
	sl_console_json_str(o, up->replicas[r].url);
	sl_str_printf(o, ",\"up\":%s,\"ejected\":%s,\"busy\":%s,\"streams\":%ld,"
	    "\"max_streams\":", value_up(m->shm, j, now) ? "true" : "false",
	    value_ejected(m->shm, j, now) ? "true" : "false",
	    value_busy(m->shm, j, now) ? "true" : "false",
	    value_streams(m->shm, j, now));
	if (up->replicas[r].max_streams > 0)
		sl_str_printf(o, "%d", (int)up->replicas[r].max_streams);
	else
		sl_str_printf(o, "null");
	if (waiting >= 0)
		sl_str_printf(o, ",\"queue\":%d", (int)waiting);
	else
		sl_str_printf(o, ",\"queue\":null");
	if (kv >= 0)
		sl_str_printf(o, ",\"kv_cache\":%d.%03d", (int)kv / 1000,
		    (int)kv % 1000);
	else
		sl_str_printf(o, ",\"kv_cache\":null");
	sl_str_printf(o, ",\"requests_last_minute\":%llu,"
	    "\"errors_last_minute\":%llu}",
	    (unsigned long long)last_minute(b, j * SL_INDEX_VALUES, v[0]),
	    (unsigned long long)last_minute(b, j * SL_INDEX_VALUES + 1,
	    v[1]));
}

static void
status_upstreams(struct master *m, struct sl_str *o, const struct since *b)
{
	const struct sl_config *cfg = m->cur.cfg;
	int64_t now = sl_mono_ms();
	size_t u, r;

	sl_str_printf(o, "\"upstreams\":[");
	for (u = 0; u < cfg->nupstreams; u++) {
		sl_str_printf(o, "%s{\"name\":", u > 0 ? "," : "");
		sl_console_json_str(o, cfg->upstreams[u].name);
		sl_str_printf(o, ",\"replicas\":[");
		for (r = 0; r < cfg->upstreams[u].nreplicas; r++)
			status_replica(m, o, b, u, r, now);
		sl_str_printf(o, "],\"waiting\":%d}",
		    cfg->upstreams[u].queue.enabled ? (int)sl_queue_waiting(
		    m->queue, m->cur.queue_slot[u]) : 0);
	}
	sl_str_printf(o, "]");
}

/* A latency in ms, or null for none (sl_console_quantile: -1). */
static void
json_ms(struct sl_str *o, double seconds)
{
	if (seconds < 0)
		sl_str_printf(o, "null");
	else
		sl_str_printf(o, "%.1f", seconds * 1000.0);
}

static void
status_models(struct master *m, struct sl_str *o, const struct since *b)
{
	const struct sl_config *cfg = m->cur.cfg;
	const double *bounds;
	size_t i;
	int k, n;

	bounds = sl_shm_mhist_bounds(SL_MHIST_TTFT, &n);
	sl_str_printf(o, ",\"models\":[");
	for (i = 0; i < cfg->nmodels; i++) {
		size_t slot = m->cur.model_slot[i], off = slot * SL_MODEL_VALUES;
		uint64_t v[SL_MODEL_VALUES], d[SL_MODEL_VALUES];

		model_counters(m, slot, v);
		for (k = 0; k < SL_MODEL_VALUES; k++)
			d[k] = last_minute(b, off + (size_t)k, v[k]);
		sl_str_printf(o, "%s{\"name\":", i > 0 ? "," : "");
		sl_console_json_str(o, cfg->models[i].name);
		sl_str_printf(o, ",\"ttft_p50_ms\":");
		json_ms(o, sl_console_quantile(bounds, n, d + 1, 0.5));
		sl_str_printf(o, ",\"ttft_p99_ms\":");
		json_ms(o, sl_console_quantile(bounds, n, d + 1, 0.99));
		sl_str_printf(o, ",\"requests_last_minute\":%llu}",
		    (unsigned long long)d[0]);
	}
	sl_str_printf(o, "]");
}

static void
render_status(struct master *m, struct sl_str *o)
{
	const struct sl_config *cfg = m->cur.cfg;
	double now = now_s();
	struct since b;
	char host[256];

	b.v = sl_window_since(m->window, now - CONSOLE_SPAN_S, &b.n);
	if (cfg->cluster.enabled && cfg->cluster.node != NULL)
		snprintf(host, sizeof(host), "%s", cfg->cluster.node);
	else if (gethostname(host, sizeof(host) - 1) == -1)
		snprintf(host, sizeof(host), "-");
	host[sizeof(host) - 1] = '\0';
	sl_str_printf(o, "{\"node\":");
	sl_console_json_str(o, host);
	sl_str_printf(o, ",\"version\":");
	sl_console_json_str(o, PACKAGE_VERSION);
	sl_str_printf(o, ",\"uptime_seconds\":%lld,\"generation\":%u,"
	    "\"workers\":%d,", (long long)(now - m->started), m->cur.id,
	    current_workers(m));
	status_tenants(m, o, &b);
	sl_str_printf(o, ",");
	status_upstreams(m, o, &b);
	if (cfg->models != NULL) {
		struct since mb;

		mb.v = sl_window_since(m->mwindow, now - CONSOLE_SPAN_S, &mb.n);
		status_models(m, o, &mb);
	}
	sl_str_printf(o, ",\"cluster\":");
	if (m->cluster == NULL)
		sl_str_printf(o, "null");
	else {
		sl_str_printf(o, "{\"mode\":");
		sl_console_json_str(o, sl_cluster_mode(m->cluster));
		sl_str_printf(o, ",\"nodes\":%d,\"leases\":%llu}",
		    sl_cluster_nodes(m->cluster),
		    (unsigned long long)sl_cluster_leases(m->cluster));
	}
	sl_str_printf(o, "}\n");
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
		return;
	}
	r->status = 200;
	if (page != NULL) {
		r->content_type = page->content_type;
		sl_str_printf(&r->body, "%.*s", (int)page->len,
		    (const char *)page->data);
	} else if (strcmp(path, "/status.json") == 0) {
		r->content_type = "application/json";
		render_status(m, &r->body);
	} else {
		r->content_type = "text/plain; version=0.0.4; charset=utf-8";
		render_metrics(m, &r->body);
	}
}

int
sl_master_run(const char *path, struct sl_config *cfg)
{
	struct master m;
	struct sigaction sa;
	sigset_t block, empty;
	int s, rc = 0;
	size_t cap;

	memset(&m, 0, sizeof(m));
	m.started = now_s();
	m.path = path;
	m.cur.cfg = cfg;
	m.cur.id = m.last_gen = 1;
	sl_log_init(cfg->log_level, "master");
	config_warn_permissions(path, cfg);

	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
		sl_err("curl_global_init failed");
		return 1;
	}
	/*
	 * Room is reserved, not committed, here and in the region: calloc of
	 * this size maps zero pages, and an index's entries are written only
	 * once it is handed out.
	 */
	heap_trim();
	m.slots.max_tenants = (size_t)cfg->limits.max_tenants;
	m.slots.replica_room = sl_config_replica_room(cfg);
	/*
	 * The region's index space: tenants (limits.max_tenants, twice over, so
	 * that a reload may name max_tenants new ones while as many removed ones
	 * finish their streams) and pool replicas. Reserved, not committed
	 * (sl_shm.h): room costs nothing until an index is used.
	 */
	cap = 2 * m.slots.max_tenants + 2 * m.slots.replica_room;
	if (sl_slots_init_tables(&m.slots, (size_t)cfg->limits.max_models,
	    (size_t)cfg->limits.max_upstreams) == -1) {
		sl_err("cannot reserve the slot tables: %s", strerror(errno));
		return 1;
	}
	m.shm = sl_shm_create(cap, MAX_ROWS, m.slots.models.n, m.slots.ups.n);
	if (sl_slots_init_index(&m.slots, m.shm, cap) == -1) {
		sl_err("cannot map the shared region: %s", strerror(errno));
		return 1;
	}
	if ((m.cur.keys = sl_keyidx_build(cfg)) == NULL) {
		sl_err("cannot build the key index");
		return 1;
	}
	m.cur.tenant_slot = map_tenants(&m, cfg, m.cur.id);
	if (map_upstreams(&m, cfg, m.cur.id, &m.cur.upstream_slot,
	    &m.cur.queue_slot) == -1)
		m.cur.upstream_slot = NULL;
	m.cur.replica_slot = map_replicas(&m, cfg, m.cur.id);
	m.cur.model_slot = map_models(&m, cfg, m.cur.id);
	if (m.cur.tenant_slot == NULL || m.cur.upstream_slot == NULL ||
	    m.cur.replica_slot == NULL || m.cur.model_slot == NULL)
		return 1;
	sl_debug("shared region: %zu bytes", sl_shm_size(m.shm));
	{
		size_t qn = 0;

		for (s = 0; (size_t)s < cfg->nupstreams; s++)
			if (cfg->upstreams[s].queue.enabled)
				qn += (size_t)cfg->upstreams[s].queue.max;
		qn = qn < QUEUE_ENTRIES_MIN ? QUEUE_ENTRIES_MIN :
		    qn > QUEUE_ENTRIES_MAX ? QUEUE_ENTRIES_MAX : qn;
		m.queue = sl_queue_create(m.shm, SL_QUEUE_POOLS, cap, qn,
		    MAX_ROWS);
		if (m.queue == NULL) {
			sl_err("cannot map the fair queue: %s", strerror(errno));
			return 1;
		}
		publish_queue(&m, cfg, m.cur.tenant_slot, m.cur.queue_slot, 0);
	}
	if ((m.prober = sl_probe_new(cfg, m.shm, m.cur.replica_slot)) == NULL) {
		sl_err("cannot set up health probes");
		return 1;
	}
	if (cfg->cluster.enabled) {
		size_t cells = cfg->limits.max_connections;

		if (cells < 1024)
			cells = 1024;
		if (cells > SL_CLUSTER_MAX_CELLS)
			cells = SL_CLUSTER_MAX_CELLS;
		m.cshm = sl_cluster_shm_create(MAX_ROWS, cells);
		if (m.cshm == NULL || (m.cluster = sl_cluster_master_new(cfg,
		    m.cshm, shm_tenant_name, &m)) == NULL) {
			sl_err("cannot set up the cluster: %s", strerror(errno));
			return 1;
		}
		/* Registered (or in on_redis_down mode) before it listens. */
		sl_cluster_master_start(m.cluster);
	}
	m.nworkers = resolve_workers(cfg);
	if (open_listeners(&m, cfg->listen, 0, m.nworkers) == -1)
		return 1;
	if (cfg->admin_listen != NULL) {
		char err[256];

		m.admin = sl_admin_open(cfg->admin_listen, err, sizeof(err));
		if (m.admin == NULL) {
			sl_err("admin_listen %s", err);
			return 1;
		}
		if ((m.window = sl_window_new(CONSOLE_SAMPLES)) == NULL ||
		    (m.mwindow = sl_window_new(CONSOLE_SAMPLES)) == NULL) {
			sl_err("cannot set up the console: %s", strerror(errno));
			return 1;
		}
		/* Every counter is 0 yet: the first minute counts from here. */
		console_sample(&m, now_s());
		m.next_sample = now_s() + CONSOLE_SAMPLE_S;
	}

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
	sigemptyset(&empty);

	if (reserve_rows(&m, m.nworkers, m.slot_row) == -1)
		return 1;
	for (s = 0; s < m.nworkers; s++)
		if (spawn(&m, s) == -1)
			return 1;
	sl_info("sluice %s listening on %s with %d worker(s), %zu tenant(s)",
	    PACKAGE_VERSION, cfg->listen, m.nworkers, cfg->ntenants);

	for (;;) {
		double timeout = -1;
		struct timespec ts;
		struct pollfd pfd[SL_ADMIN_POLLFDS + SL_PROBE_POLLFDS + 1];
		int npfd = 0, nadmin = 0, ncl = 0;
		double pt;

		if (got_chld) {
			got_chld = 0;
			reap(&m);
		}
		if (got_quit && m.stopping < 2) {
			got_quit = 0;
			sl_info("SIGQUIT: exiting now");
			m.stopping = 2;
			signal_children(&m, SIGQUIT, 0);
			m.stop_deadline = now_s() + 2.0;
		}
		if (got_term && !m.stopping) {
			got_term = 0;
			sl_info("shutting down: draining for up to %.1f s",
			    (double)m.cur.cfg->drain_timeout_ms / 1000.0);
			m.stopping = 1;
			signal_children(&m, SIGTERM, 0);
			/*
			 * Refuse new connections at once: with every copy of the
			 * listen sockets closed, the kernel answers RST instead
			 * of queueing clients nobody will accept.
			 */
			for (s = 0; s < m.nlisten; s++)
				close(m.listen_fds[s]);
			m.nlisten = 0;
			m.stop_deadline = now_s() +
			    (double)m.cur.cfg->drain_timeout_ms / 1000.0 + 5.0;
		}
		if (got_hup) {
			got_hup = 0;
			if (!m.stopping)
				reload(&m);
		}
		if (got_usr1) {
			got_usr1 = 0;
			sl_info("SIGUSR1: workers reopen the access log");
			signal_children(&m, SIGUSR1, 0);
		}
		if (m.stopping) {
			if (nchildren(&m) == 0)
				break;
			if (now_s() >= m.stop_deadline) {
				sl_warn("workers did not exit in time; killing them");
				signal_children(&m, SIGKILL, 0);
				m.stop_deadline = now_s() + 5.0;
			}
			timeout = m.stop_deadline - now_s();
		} else
			respawn_due(&m, &timeout);
		if (m.admin != NULL) {
			double at = sl_admin_timeout(m.admin, now_s());

			if (now_s() >= m.next_sample) {
				console_sample(&m, now_s());
				/* Late (a long reload): from now, not in a burst. */
				m.next_sample += CONSOLE_SAMPLE_S;
				if (m.next_sample <= now_s())
					m.next_sample = now_s() + CONSOLE_SAMPLE_S;
			}
			if (at < 0 || m.next_sample - now_s() < at)
				at = m.next_sample - now_s() > 0 ?
				    m.next_sample - now_s() : 0;

			npfd = sl_admin_pollfds(m.admin, pfd, SL_ADMIN_POLLFDS,
			    now_s());
			if (at >= 0 && (timeout < 0 || at < timeout))
				timeout = at;
		}
		nadmin = npfd;
		if (!m.stopping) {
			npfd += sl_probe_pollfds(m.prober, pfd + npfd,
			    SL_PROBE_POLLFDS);
			pt = sl_probe_timeout(m.prober, now_s());
			if (pt >= 0 && (timeout < 0 || pt < timeout))
				timeout = pt;
		}
		if (m.cluster != NULL) {
			/* Also while draining: leases of running streams live on. */
			ncl = sl_cluster_master_pollfds(m.cluster, pfd + npfd, 1);
			npfd += ncl;
			pt = sl_cluster_master_timeout(m.cluster, now_s());
			if (pt >= 0 && (timeout < 0 || pt < timeout))
				timeout = pt;
		}
		if (timeout >= 0) {
			if (timeout < 0.001)
				timeout = 0.001;
			ts.tv_sec = (time_t)timeout;
			ts.tv_nsec = (long)((timeout - (double)ts.tv_sec) * 1e9);
		}
		/* Sleep with signals unblocked; flags are rechecked on wake. */
		if (ppoll(npfd ? pfd : NULL, (nfds_t)npfd, timeout >= 0 ? &ts : NULL,
		    &empty) == -1) {
			if (errno == EINTR)
				continue;
			sl_err("ppoll: %s", strerror(errno));
			rc = 1;
			break;
		}
		if (m.admin != NULL)
			sl_admin_service(m.admin, pfd, nadmin, now_s(), admin_handle,
			    &m);
		if (!m.stopping)
			sl_probe_service(m.prober, now_s());
		if (m.cluster != NULL)
			sl_cluster_master_service(m.cluster, pfd + npfd - ncl, ncl,
			    now_s());
	}
	sl_info("stopped");
	for (s = 0; s < m.nlisten; s++)
		close(m.listen_fds[s]);
	free(m.listen_fds);
	free(m.cur.tenant_slot);
	free(m.cur.upstream_slot);
	free(m.cur.queue_slot);
	free(m.cur.model_slot);
	sl_probe_free(m.prober);
	sl_slots_free_replica_map(m.cur.replica_slot, m.cur.cfg->nupstreams);
	sl_slots_free(&m.slots);
	sl_admin_close(m.admin);
	sl_window_free(m.window);
	sl_window_free(m.mwindow);
	free(m.sample);
	sl_cluster_master_free(m.cluster);
	sl_cluster_shm_destroy(m.cshm);
	sl_config_free(m.cur.cfg);
	sl_keyidx_free(m.cur.keys);
	sl_queue_destroy(m.queue);
	sl_shm_destroy(m.shm);
	curl_global_cleanup();
	return rc;
}
