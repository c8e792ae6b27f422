/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Bounded byte ring. Memory grows by doubling from SL_BUF_MIN_ALLOC up to
 * cap, so a stream whose client keeps up never holds more than a few KiB,
 * and one whose client stalls holds at most cap.
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sl_buf.h"

#define SL_BUF_MIN_ALLOC SL_BLOCK_SIZE

int
sl_blocks_init(struct sl_blocks *p, size_t max)
{
	p->n = 0;
	p->max = max;
	p->free = calloc(max ? max : 1, sizeof(*p->free));
	return p->free == NULL ? -1 : 0;
}

void
sl_blocks_free(struct sl_blocks *p)
{
	while (p->n > 0)
		free(p->free[--p->n]);
	free(p->free);
	p->free = NULL;
}

void *
sl_block_get(struct sl_blocks *p)
{
	if (p != NULL && p->n > 0)
		return p->free[--p->n];
	return malloc(SL_BLOCK_SIZE);
}

void
sl_block_put(struct sl_blocks *p, void *blk)
{
	if (blk == NULL)
		return;
	if (p != NULL && p->n < p->max)
		p->free[p->n++] = blk;
	else
		free(blk);
}

void
sl_buf_init(struct sl_buf *b, size_t cap)
{
	memset(b, 0, sizeof(*b));
	b->cap = cap;
}

/* Free memory of b->alloc bytes: a block goes back to the pool. */
static void
buf_drop(struct sl_buf *b, char *data, size_t alloc)
{
	if (alloc == SL_BLOCK_SIZE)
		sl_block_put(b->pool, data);
	else
		free(data);
}

void
sl_buf_release(struct sl_buf *b)
{
	if (b->len == 0 && b->data != NULL)
		sl_buf_free(b);
}

void
sl_buf_free(struct sl_buf *b)
{
	buf_drop(b, b->data, b->alloc);
	b->data = NULL;
	b->alloc = 0;
	b->head = 0;
	b->len = 0;
}

/* Grow to hold at least need bytes, linearising the contents. */
static int
buf_grow(struct sl_buf *b, size_t need)
{
	size_t na = b->alloc + b->alloc / 2;
	char *nd;

	/*
	 * Grow by half, at least to what is needed, in whole pages: a 16 KiB
	 * event plus framing takes 20 KiB, not the 32 KiB doubling would.
	 */
	if (na < need)
		na = need;
	if (na < SL_BUF_MIN_ALLOC)
		na = SL_BUF_MIN_ALLOC;
	na = (na + SL_BUF_MIN_ALLOC - 1) / SL_BUF_MIN_ALLOC * SL_BUF_MIN_ALLOC;
	if (na > b->cap)
		na = b->cap;
	if (na < need)
		return -1;
	nd = na == SL_BLOCK_SIZE ? sl_block_get(b->pool) : malloc(na);
	if (nd == NULL)
		return -1;
	if (b->len > 0)
		sl_buf_peek(b, nd, b->len);
	buf_drop(b, b->data, b->alloc);
	b->data = nd;
	b->alloc = na;
	b->head = 0;
	return 0;
}

/* Copy n bytes in at offset tail of the ring (the room is there). */
static inline void
buf_put(struct sl_buf *b, size_t tail, const void *p, size_t n)
{
	size_t first = b->alloc - tail;

	if (first > n)
		first = n;
	memcpy(b->data + tail, p, first);
	if (n > first)
		memcpy(b->data, (const char *)p + first, n - first);
}

/* The ring offset off bytes past head (off <= alloc): no division. */
static inline size_t
buf_off(const struct sl_buf *b, size_t off)
{
	size_t t = b->head + off;

	return t >= b->alloc ? t - b->alloc : t;
}

int
sl_buf_append(struct sl_buf *b, const void *p, size_t n)
{
	struct iovec iov;

	iov.iov_base = (void *)(uintptr_t)p;
	iov.iov_len = n;
	return sl_buf_appendv(b, &iov, 1);
}

int
sl_buf_appendv(struct sl_buf *b, const struct iovec *iov, int cnt)
{
	size_t n = 0, tail;
	int i;

	for (i = 0; i < cnt; i++)
		n += iov[i].iov_len;
	if (n == 0)
		return 0;
	if (n > b->cap - b->len)
		return -1;
	if (b->len + n > b->alloc && buf_grow(b, b->len + n) == -1)
		return -1;
	tail = buf_off(b, b->len);
	for (i = 0; i < cnt; i++) {
		buf_put(b, tail, iov[i].iov_base, iov[i].iov_len);
		tail += iov[i].iov_len;
		if (tail >= b->alloc)
			tail -= b->alloc;
	}
	b->len += n;
	return 0;
}

int
sl_buf_iov(const struct sl_buf *b, struct iovec iov[2])
{
	size_t first;

	if (b->len == 0)
		return 0;
	first = b->alloc - b->head;
	if (first >= b->len) {
		iov[0].iov_base = b->data + b->head;
		iov[0].iov_len = b->len;
		return 1;
	}
	iov[0].iov_base = b->data + b->head;
	iov[0].iov_len = first;
	iov[1].iov_base = b->data;
	iov[1].iov_len = b->len - first;
	return 2;
}

void
sl_buf_consume(struct sl_buf *b, size_t n)
{
	if (n >= b->len) {
		/* Empty: restart at offset 0 so the next appends are contiguous. */
		b->head = 0;
		b->len = 0;
		return;
	}
	b->head = buf_off(b, n);
	b->len -= n;
}

size_t
sl_buf_peek(const struct sl_buf *b, void *p, size_t n)
{
	struct iovec iov[2];
	int cnt, i;
	size_t done = 0, k;

	cnt = sl_buf_iov(b, iov);
	for (i = 0; i < cnt && done < n; i++) {
		k = iov[i].iov_len;
		if (k > n - done)
			k = n - done;
		memcpy((char *)p + done, iov[i].iov_base, k);
		done += k;
	}
	return done;
}

int
sl_bytes_reserve(char **p, size_t *cap, size_t need, size_t first)
{
	size_t nc;
	char *np;

	if (need <= *cap)
		return 0;
	nc = *cap ? *cap : first;
	while (nc < need)
		nc *= 2;
	if ((np = realloc(*p, nc)) == NULL)
		return -1;
	*p = np;
	*cap = nc;
	return 0;
}
