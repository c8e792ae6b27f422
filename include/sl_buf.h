/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_buf: a bounded byte ring. The only place response bytes wait in the
 * gateway. Memory is allocated lazily and grows by doubling up to `cap`
 * bytes, never beyond: sl_buf_append refuses what does not fit.
 */
#ifndef SL_BUF_H
#define SL_BUF_H

#include <stddef.h>
#include <sys/uio.h>

/*
 * A free list of SL_BLOCK_SIZE blocks, one per worker: what a stream keeps
 * in memory while it has nothing buffered is nothing, and taking a block
 * back when the next event comes is a pointer pop, not a malloc.
 */
#define SL_BLOCK_SIZE 4096

struct sl_blocks {
	void **free;     /* [max] */
	size_t n, max;
};

/* A pool keeping at most max free blocks; -1 when out of memory. */
int sl_blocks_init(struct sl_blocks *, size_t max);
void sl_blocks_free(struct sl_blocks *);
/* A block of SL_BLOCK_SIZE bytes, or NULL. pool may be NULL (malloc). */
void *sl_block_get(struct sl_blocks *);
/* Give a block back (pool may be NULL: free). */
void sl_block_put(struct sl_blocks *, void *);

struct sl_buf {
	char *data;      /* NULL until the first append */
	struct sl_blocks *pool;   /* where a first block comes from; may be NULL */
	size_t alloc;    /* bytes allocated (<= cap) */
	size_t cap;      /* hard bound */
	size_t head;     /* offset of the first byte */
	size_t len;      /* bytes stored */
};

/* Set up an empty buffer bounded by cap bytes (cap > 0). Allocates nothing. */
void sl_buf_init(struct sl_buf *, size_t cap);
/* Free the memory; the buffer is empty and reusable afterwards. */
void sl_buf_free(struct sl_buf *);

/* If the buffer is empty, give its memory back (a block to its pool). */
void sl_buf_release(struct sl_buf *);

static inline size_t sl_buf_len(const struct sl_buf *b) { return b->len; }
static inline size_t sl_buf_space(const struct sl_buf *b) { return b->cap - b->len; }

/*
 * Append n bytes. All or nothing: returns 0 when all n were stored, -1 when
 * they do not fit under cap or memory is exhausted (buffer unchanged).
 */
int sl_buf_append(struct sl_buf *, const void *p, size_t n);
/* The pieces of iov in order, all or nothing, like one sl_buf_append. */
int sl_buf_appendv(struct sl_buf *, const struct iovec *iov, int cnt);

/*
 * Fill up to two iovecs with the stored bytes in order; returns how many
 * were filled (0 when empty).
 */
int sl_buf_iov(const struct sl_buf *, struct iovec iov[2]);

/* Drop n bytes (n <= len) from the front, after they were written out. */
void sl_buf_consume(struct sl_buf *, size_t n);

/* Copy up to n bytes from the front into p without consuming; returns count. */
size_t sl_buf_peek(const struct sl_buf *, void *p, size_t n);

/*
 * An unbounded byte array (*p, *cap) with room for need bytes: its capacity
 * doubles from first (or from what it has). 0, or -1 when out of memory
 * (*p and *cap unchanged). The growable strings outside the stream buffer
 * (an HTTP/2 head, a stream's request bytes, output batches) share it.
 */
int sl_bytes_reserve(char **p, size_t *cap, size_t need, size_t first);

#endif
