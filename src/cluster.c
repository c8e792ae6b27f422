/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The region the master and its workers share (cluster_int.h): mapped by
 * the master before fork; every stream's cell, each row's counters.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cluster_int.h"

struct cell *
cl_cell_at(struct sl_cluster_shm *cs, size_t row, size_t i)
{
	struct cell *base = (struct cell *)(void *)&cs->row[cs->rows];

	return &base[row * cs->cells + i];
}

struct sl_cluster_shm *
sl_cluster_shm_create(size_t rows, size_t cells)
{
	struct sl_cluster_shm *cs;
	struct timespec ts;
	size_t size;
	void *p;

	size = sizeof(*cs) + rows * sizeof(struct row) +
	    rows * cells * sizeof(struct cell);
	p = mmap(NULL, size, PROT_READ | PROT_WRITE,
	    MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	cs = p;
	cs->rows = rows;
	cs->cells = cells;
	cs->size = size;
	clock_gettime(CLOCK_REALTIME, &ts);
	cs->epoch = ((uint64_t)ts.tv_sec << 24) ^ (uint64_t)ts.tv_nsec ^
	    ((uint64_t)getpid() << 44);
	atomic_store(&cs->mode, MODE_DOWN);
	return cs;
}

void
sl_cluster_shm_destroy(struct sl_cluster_shm *cs)
{
	if (cs != NULL)
		munmap(cs, cs->size);
}

/* "NODE:EPOCH:ROW.CELL.GEN" */
int
cl_member_fmt(char *dst, size_t len, const char *node, uint64_t epoch,
    size_t row, size_t i, uint32_t gen)
{
	return snprintf(dst, len, "%s:%016" PRIx64 ":%zu.%zu.%" PRIu32, node,
	    epoch, row, i, gen);
}

void
cl_row_state(struct sl_cluster_shm *cs, size_t row, uint32_t st)
{
	atomic_store_explicit(&cs->row[row].state, st, memory_order_release);
}

void
cl_addr_publish(struct sl_cluster_shm *cs, const char *addr)
{
	uint32_t seq = atomic_load_explicit(&cs->addr_seq, memory_order_relaxed);

	atomic_store_explicit(&cs->addr_seq, seq + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	snprintf(cs->addr, sizeof(cs->addr), "%s", addr);
	atomic_store_explicit(&cs->addr_seq, seq + 2, memory_order_release);
}

uint32_t
cl_addr_read(struct sl_cluster_shm *cs, char dst[80])
{
	uint32_t s1, s2;

	for (;;) {
		s1 = atomic_load_explicit(&cs->addr_seq, memory_order_acquire);
		if (s1 & 1u)
			continue;   /* the master is writing it: a few stores */
		memcpy(dst, cs->addr, sizeof(cs->addr));
		atomic_thread_fence(memory_order_acquire);
		s2 = atomic_load_explicit(&cs->addr_seq, memory_order_relaxed);
		if (s1 == s2)
			break;
	}
	dst[79] = '\0';
	return s1;
}
