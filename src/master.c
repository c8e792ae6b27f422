/*
 * The master never serves traffic. It opens one SO_REUSEPORT listen socket
 * per worker slot before forking (a respawned worker inherits its slot's
 * accept queue), maps the shared region, forks workers and then only waits
 * for signals and child exits, in a ppoll() loop whose signal mask closes
 * the race between checking flags and sleeping.
 */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "sl_log.h"
#include "sl_master.h"
#include "sl_net.h"
#include "sl_shm.h"
#include "sl_worker.h"

#define MAX_ROWS 256                 /* worker rows: current + draining */
#define MIN_TENANT_CAPACITY 1024
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

/* A generation: one config and the tenant mapping its workers use. */
struct gen {
	struct sl_config *cfg;
	size_t *tenant_slot;
	unsigned id;
};

struct master {
	const char *path;
	struct gen cur;
	struct sl_shm *shm;
	char **shm_names;            /* shm tenant index -> name (or NULL) */
	size_t shm_ntenants;         /* indices handed out so far */
	int *listen_fds;
	int nlisten;
	int nworkers;
	struct child children[MAX_ROWS];
	unsigned char row_used[MAX_ROWS];
	double respawn_at[SL_MAX_WORKERS];   /* 0: none pending */
	int stopping;                /* 1 drain, 2 quit */
	double stop_deadline;
	unsigned reloads_ok, reloads_failed;
};

static volatile sig_atomic_t got_hup, got_term, got_quit, got_chld;

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

/*
 * Map every tenant of cfg to a stable shm index (same name, same index
 * across reloads) and publish limits. Tenants that disappeared are retired
 * (limit 0): their in-flight streams still release. Returns the mapping
 * (caller owns) or NULL when the region is full.
 */
static size_t *
map_tenants(struct master *m, const struct sl_config *cfg)
{
	size_t *map, i, j;
	unsigned char *keep;

	map = calloc(cfg->ntenants ? cfg->ntenants : 1, sizeof(*map));
	keep = calloc(sl_shm_max_tenants(m->shm), 1);
	if (map == NULL || keep == NULL)
		goto fail;
	for (i = 0; i < cfg->ntenants; i++) {
		for (j = 0; j < m->shm_ntenants; j++)
			if (m->shm_names[j] != NULL &&
			    strcmp(m->shm_names[j], cfg->tenants[i].name) == 0)
				break;
		if (j == m->shm_ntenants) {
			if (j == sl_shm_max_tenants(m->shm)) {
				sl_err("tenant capacity (%zu) exhausted; restart to grow it",
				    sl_shm_max_tenants(m->shm));
				goto fail;
			}
			m->shm_names[j] = strdup(cfg->tenants[i].name);
			if (m->shm_names[j] == NULL)
				goto fail;
			m->shm_ntenants++;
		}
		map[i] = j;
		keep[j] = 1;
	}
	/* Publish only once the whole mapping exists. */
	for (i = 0; i < cfg->ntenants; i++)
		sl_shm_set_limit(m->shm, map[i], cfg->tenants[i].max_streams);
	for (j = 0; j < m->shm_ntenants; j++)
		if (!keep[j])
			sl_shm_set_limit(m->shm, j, 0);
	free(keep);
	return map;
fail:
	free(map);
	free(keep);
	return NULL;
}

static int
alloc_row(struct master *m)
{
	int r;

	for (r = 0; r < MAX_ROWS; r++)
		if (!m->row_used[r]) {
			m->row_used[r] = 1;
			return r;
		}
	return -1;
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
	pid_t pid;

	ch = free_child(m);
	row = alloc_row(m);
	if (ch == NULL || row < 0) {
		if (row >= 0)
			m->row_used[row] = 0;
		sl_err("no free worker row (too many draining workers)");
		return -1;
	}
	pid = fork();
	if (pid == -1) {
		sl_err("fork: %s", strerror(errno));
		m->row_used[row] = 0;
		return -1;
	}
	if (pid == 0) {
		struct sigaction sa;

		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = SIG_DFL;
		sigaction(SIGHUP, &sa, NULL);
		sigaction(SIGTERM, &sa, NULL);
		sigaction(SIGINT, &sa, NULL);
		sigaction(SIGQUIT, &sa, NULL);
		sigaction(SIGCHLD, &sa, NULL);
		for (i = 0; i < m->nlisten; i++)
			if (i != slot)
				close(m->listen_fds[i]);
		memset(&a, 0, sizeof(a));
		a.cfg = m->cur.cfg;
		a.shm = m->shm;
		a.tenant_slot = m->cur.tenant_slot;
		a.row = (size_t)row;
		a.listen_fd = m->listen_fds[slot];
		a.index = slot;
		a.generation = m->cur.id;
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
	pid_t pid;
	int status, i;

	while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
		struct child *ch = NULL;
		int64_t reclaimed;

		for (i = 0; i < MAX_ROWS; i++)
			if (m->children[i].pid == pid) {
				ch = &m->children[i];
				break;
			}
		if (ch == NULL)
			continue;
		/* The worker is gone: its held slots go back to their tenants. */
		reclaimed = sl_shm_reclaim_row(m->shm, ch->row);
		m->row_used[ch->row] = 0;
		if (WIFSIGNALED(status))
			sl_warn("worker %d (pid %d) killed by signal %d; "
			    "%lld slot(s) reclaimed", ch->slot, (int)pid,
			    WTERMSIG(status), (long long)reclaimed);
		else if (WEXITSTATUS(status) != 0 || (!m->stopping && !ch->draining &&
		    ch->gen == m->cur.id))
			sl_warn("worker %d (pid %d) exited with status %d; "
			    "%lld slot(s) reclaimed", ch->slot, (int)pid,
			    WEXITSTATUS(status), (long long)reclaimed);
		else
			sl_debug("worker %d (pid %d) exited", ch->slot, (int)pid);
		if (!m->stopping && !ch->draining && ch->gen == m->cur.id &&
		    ch->slot < m->nworkers) {
			double age = now_s() - ch->started;

			m->respawn_at[ch->slot] = age < RESPAWN_BACKOFF_S ?
			    now_s() + RESPAWN_BACKOFF_S : now_s();
		}
		ch->pid = 0;
	}
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
config_warn_permissions(const char *path)
{
	struct stat st;

	if (stat(path, &st) == 0 && (st.st_mode & S_IROTH))
		sl_warn("%s holds API keys and is readable by others "
		    "(chmod o-r)", path);
}

/* SIGHUP: parse, validate, then swap. An invalid file changes nothing. */
static void
reload(struct master *m)
{
	struct sl_config *ncfg = NULL;
	struct sl_errors errs = { NULL, 0 };
	size_t *map;
	int nw, s;
	struct gen old;

	sl_info("reloading %s", m->path);
	if (sl_config_load_file(m->path, &ncfg, &errs) == -1) {
		size_t i;

		for (i = 0; i < errs.n; i++)
			sl_err("%s", errs.msg[i]);
		sl_err("reload failed: %zu problem(s); keeping the running "
		    "configuration", errs.n);
		sl_errors_free(&errs);
		m->reloads_failed++;
		return;
	}
	if (strcmp(ncfg->listen, m->cur.cfg->listen) != 0) {
		sl_warn("reload: 'listen' changes need a restart; keeping %s",
		    m->cur.cfg->listen);
		free(ncfg->listen);
		ncfg->listen = strdup(m->cur.cfg->listen);
	}
	nw = resolve_workers(ncfg);
	if (nw > m->nlisten && open_listeners(m, ncfg->listen, m->nlisten, nw) == -1) {
		sl_err("reload failed: cannot open listen sockets");
		sl_config_free(ncfg);
		m->reloads_failed++;
		return;
	}
	map = map_tenants(m, ncfg);
	if (map == NULL) {
		sl_err("reload failed: cannot map tenants");
		sl_config_free(ncfg);
		m->reloads_failed++;
		return;
	}
	config_warn_permissions(m->path);
	sl_log_set_level(ncfg->log_level);
	old = m->cur;
	m->cur.cfg = ncfg;
	m->cur.tenant_slot = map;
	m->cur.id = old.id + 1;
	m->nworkers = nw;
	memset(m->respawn_at, 0, sizeof(m->respawn_at));
	/* Old workers drain: they stop accepting and finish their streams. */
	for (s = 0; s < MAX_ROWS; s++)
		if (m->children[s].pid > 0 && m->children[s].gen != m->cur.id) {
			m->children[s].draining = 1;
			kill(m->children[s].pid, SIGTERM);
		}
	for (s = 0; s < nw; s++)
		if (spawn(m, s) == -1)
			m->respawn_at[s] = now_s() + RESPAWN_BACKOFF_S;
	/* Children hold their own copies of the old generation. */
	sl_config_free(old.cfg);
	free(old.tenant_slot);
	m->reloads_ok++;
	sl_info("reloaded: generation %u, %d worker(s), %zu tenant(s)",
	    m->cur.id, nw, ncfg->ntenants);
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
	m.path = path;
	m.cur.cfg = cfg;
	m.cur.id = 1;
	sl_log_init(cfg->log_level, "master");
	config_warn_permissions(path);

	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
		sl_err("curl_global_init failed");
		return 1;
	}
	cap = cfg->ntenants * 4;
	if (cap < MIN_TENANT_CAPACITY)
		cap = MIN_TENANT_CAPACITY;
	m.shm = sl_shm_create(cap, MAX_ROWS);
	m.shm_names = calloc(cap, sizeof(char *));
	if (m.shm == NULL || m.shm_names == NULL) {
		sl_err("cannot map the shared region: %s", strerror(errno));
		return 1;
	}
	m.cur.tenant_slot = map_tenants(&m, cfg);
	if (m.cur.tenant_slot == NULL)
		return 1;
	m.nworkers = resolve_workers(cfg);
	if (open_listeners(&m, cfg->listen, 0, m.nworkers) == -1)
		return 1;

	sigemptyset(&block);
	sigaddset(&block, SIGHUP);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGQUIT);
	sigaddset(&block, SIGCHLD);
	sigprocmask(SIG_BLOCK, &block, NULL);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGHUP, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGQUIT, &sa, NULL);
	sigaction(SIGCHLD, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&empty);

	for (s = 0; s < m.nworkers; s++)
		if (spawn(&m, s) == -1)
			return 1;
	sl_info("sluice %s listening on %s with %d worker(s), %zu tenant(s)",
	    PACKAGE_VERSION, cfg->listen, m.nworkers, cfg->ntenants);

	for (;;) {
		double timeout = -1;
		struct timespec ts;

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
			m.stop_deadline = now_s() +
			    (double)m.cur.cfg->drain_timeout_ms / 1000.0 + 5.0;
		}
		if (got_hup) {
			got_hup = 0;
			if (!m.stopping)
				reload(&m);
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
		if (timeout >= 0) {
			if (timeout < 0.001)
				timeout = 0.001;
			ts.tv_sec = (time_t)timeout;
			ts.tv_nsec = (long)((timeout - (double)ts.tv_sec) * 1e9);
		}
		/* Sleep with signals unblocked; flags are rechecked on wake. */
		if (ppoll(NULL, 0, timeout >= 0 ? &ts : NULL, &empty) == -1 &&
		    errno != EINTR) {
			sl_err("ppoll: %s", strerror(errno));
			rc = 1;
			break;
		}
	}
	sl_info("stopped");
	for (s = 0; s < m.nlisten; s++)
		close(m.listen_fds[s]);
	free(m.listen_fds);
	for (cap = 0; cap < m.shm_ntenants; cap++)
		free(m.shm_names[cap]);
	free(m.shm_names);
	free(m.cur.tenant_slot);
	sl_config_free(m.cur.cfg);
	sl_shm_destroy(m.shm);
	curl_global_cleanup();
	return rc;
}
