/*
 * sl_buf: a bounded byte ring. The only place response bytes wait in the
 * gateway. Memory is allocated lazily and grows by doubling up to `cap`
 * bytes, never beyond: sl_buf_append refuses what does not fit.
 */
#ifndef SL_BUF_H
#define SL_BUF_H

#include <stddef.h>
#include <sys/uio.h>

struct sl_buf {
	char *data;      /* NULL until the first append */
	size_t alloc;    /* bytes allocated (<= cap) */
	size_t cap;      /* hard bound */
	size_t head;     /* offset of the first byte */
	size_t len;      /* bytes stored */
};

/* Set up an empty buffer bounded by cap bytes (cap > 0). Allocates nothing. */
void sl_buf_init(struct sl_buf *, size_t cap);
/* Free the memory; the buffer is empty and reusable afterwards. */
void sl_buf_free(struct sl_buf *);

static inline size_t sl_buf_len(const struct sl_buf *b) { return b->len; }
static inline size_t sl_buf_space(const struct sl_buf *b) { return b->cap - b->len; }

/*
 * Append n bytes. All or nothing: returns 0 when all n were stored, -1 when
 * they do not fit under cap or memory is exhausted (buffer unchanged).
 */
int sl_buf_append(struct sl_buf *, const void *p, size_t n);

/*
 * Fill up to two iovecs with the stored bytes in order; returns how many
 * were filled (0 when empty).
 */
int sl_buf_iov(const struct sl_buf *, struct iovec iov[2]);

/* Drop n bytes (n <= len) from the front, after they were written out. */
void sl_buf_consume(struct sl_buf *, size_t n);

/* Copy up to n bytes from the front into p without consuming; returns count. */
size_t sl_buf_peek(const struct sl_buf *, void *p, size_t n);

#endif
