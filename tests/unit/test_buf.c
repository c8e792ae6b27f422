/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Unit tests for the bounded byte ring (src/buf.c): order, the hard cap,
 * lazy and capped allocation, wrap-around against a reference model, and a
 * slow consumer that must never make the buffer exceed its cap.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include <cmocka.h>

#include "unit.h"

#include "sl_buf.h"

/* The buffer under test, freed by the teardown even when an assert fails. */
struct fx {
	struct sl_buf b;
	unsigned char *model;
	unsigned char *tmp;
};

static int
setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));

	if (f == NULL)
		return -1;
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	struct fx *f = *state;

	sl_buf_free(&f->b);
	free(f->model);
	free(f->tmp);
	free(f);
	return 0;
}

/* Deterministic generator (xorshift64*): same sequence on every run. */
static uint64_t
rnd(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ULL;
}

/* Byte i of an endless test stream: detects loss, duplication, reordering. */
static unsigned char
stream_byte(uint64_t i)
{
	return (unsigned char)((i * 131 + (i >> 8) * 7 + 3) & 0xff);
}

/* The stored bytes, in order, as the two iovecs give them. */
static size_t
flatten(const struct sl_buf *b, unsigned char *out)
{
	struct iovec iov[2];
	int n = sl_buf_iov(b, iov), i;
	size_t done = 0;

	for (i = 0; i < n; i++) {
		memcpy(out + done, iov[i].iov_base, iov[i].iov_len);
		done += iov[i].iov_len;
	}
	return done;
}

static void
test_init_allocates_nothing(void **state)
{
	struct fx *f = *state;
	struct iovec iov[2];
	char c;

	sl_buf_init(&f->b, 65536);
	assert_null(f->b.data);
	assert_int_equal(f->b.alloc, 0);
	assert_int_equal(f->b.cap, 65536);
	assert_int_equal(sl_buf_len(&f->b), 0);
	assert_int_equal(sl_buf_space(&f->b), 65536);
	assert_int_equal(sl_buf_iov(&f->b, iov), 0);
	assert_int_equal(sl_buf_peek(&f->b, &c, 1), 0);
	/* A zero-byte append stores nothing and still allocates nothing. */
	assert_int_equal(sl_buf_append(&f->b, "x", 0), 0);
	assert_null(f->b.data);
	assert_int_equal(sl_buf_len(&f->b), 0);
}

static void
test_append_iov_consume_in_order(void **state)
{
	struct fx *f = *state;
	struct iovec iov[2];
	char out[64];

	sl_buf_init(&f->b, 1024);
	assert_int_equal(sl_buf_append(&f->b, "hello ", 6), 0);
	assert_int_equal(sl_buf_append(&f->b, "world", 5), 0);
	assert_int_equal(sl_buf_len(&f->b), 11);
	assert_int_equal(sl_buf_space(&f->b), 1024 - 11);
	assert_int_equal(sl_buf_iov(&f->b, iov), 1);
	assert_int_equal(iov[0].iov_len, 11);
	assert_memory_equal(iov[0].iov_base, "hello world", 11);

	sl_buf_consume(&f->b, 6);
	assert_int_equal(sl_buf_len(&f->b), 5);
	assert_int_equal(sl_buf_iov(&f->b, iov), 1);
	assert_int_equal(iov[0].iov_len, 5);
	assert_memory_equal(iov[0].iov_base, "world", 5);

	assert_int_equal(sl_buf_append(&f->b, "!", 1), 0);
	assert_int_equal(flatten(&f->b, (unsigned char *)out), 6);
	assert_memory_equal(out, "world!", 6);
}

static void
test_append_exactly_cap_fits_one_more_refused(void **state)
{
	struct fx *f = *state;
	unsigned char in[1000], out[1000];
	struct sl_buf before;
	size_t i;

	for (i = 0; i < sizeof(in); i++)
		in[i] = stream_byte(i);
	sl_buf_init(&f->b, sizeof(in));
	assert_int_equal(sl_buf_append(&f->b, in, sizeof(in)), 0);
	assert_int_equal(sl_buf_len(&f->b), sizeof(in));
	assert_int_equal(sl_buf_space(&f->b), 0);
	assert_true(f->b.alloc <= f->b.cap);

	before = f->b;
	assert_int_equal(sl_buf_append(&f->b, "x", 1), -1);
	/* Refused: nothing moved, nothing reallocated. */
	assert_ptr_equal(f->b.data, before.data);
	assert_int_equal(f->b.alloc, before.alloc);
	assert_int_equal(f->b.head, before.head);
	assert_int_equal(f->b.len, before.len);
	assert_int_equal(flatten(&f->b, out), sizeof(in));
	assert_memory_equal(out, in, sizeof(in));
}

static void
test_append_that_does_not_fit_is_all_or_nothing(void **state)
{
	struct fx *f = *state;
	unsigned char in[1000], out[1000];
	size_t i;

	for (i = 0; i < sizeof(in); i++)
		in[i] = stream_byte(i);
	sl_buf_init(&f->b, sizeof(in));
	assert_int_equal(sl_buf_append(&f->b, in, 600), 0);
	/* 401 bytes with 400 free: refused whole, not truncated to 400. */
	assert_int_equal(sl_buf_append(&f->b, in + 600, 401), -1);
	assert_int_equal(sl_buf_len(&f->b), 600);
	assert_int_equal(flatten(&f->b, out), 600);
	assert_memory_equal(out, in, 600);
	/* 400 do fit. */
	assert_int_equal(sl_buf_append(&f->b, in + 600, 400), 0);
	assert_int_equal(flatten(&f->b, out), 1000);
	assert_memory_equal(out, in, 1000);
}

static void
test_append_larger_than_cap_allocates_nothing(void **state)
{
	struct fx *f = *state;
	char big[101];

	memset(big, 'a', sizeof(big));
	sl_buf_init(&f->b, 100);
	assert_int_equal(sl_buf_append(&f->b, big, sizeof(big)), -1);
	assert_null(f->b.data);
	assert_int_equal(f->b.alloc, 0);
	assert_int_equal(sl_buf_len(&f->b), 0);
}

static void
test_small_cap_never_allocates_beyond_cap(void **state)
{
	struct fx *f = *state;

	/* Below the minimum allocation step: the cap still wins. */
	sl_buf_init(&f->b, 100);
	assert_int_equal(sl_buf_append(&f->b, "x", 1), 0);
	assert_non_null(f->b.data);
	assert_true(f->b.alloc <= 100);
	assert_true(f->b.alloc >= 1);
}

static void
test_growth_is_lazy_and_capped(void **state)
{
	struct fx *f = *state;
	unsigned char chunk[1000];
	size_t prev = 0, total = 0;

	memset(chunk, 0x5a, sizeof(chunk));
	sl_buf_init(&f->b, 1u << 20);
	assert_int_equal(sl_buf_append(&f->b, chunk, 10), 0);
	total = 10;
	/* A client that keeps up costs a few KiB, not the whole cap. */
	assert_true(f->b.alloc <= 4096);
	while (sl_buf_append(&f->b, chunk, sizeof(chunk)) == 0) {
		total += sizeof(chunk);
		assert_true(f->b.alloc >= sl_buf_len(&f->b));
		assert_true(f->b.alloc <= f->b.cap);
		assert_true(f->b.alloc >= prev);   /* never shrinks while in use */
		prev = f->b.alloc;
	}
	assert_int_equal(sl_buf_len(&f->b), total);
	assert_true(total > (1u << 20) - sizeof(chunk));
	assert_true(f->b.alloc <= (1u << 20));
	/* The remainder that does fit is still accepted. */
	assert_int_equal(sl_buf_append(&f->b, chunk, sl_buf_space(&f->b)), 0);
	assert_int_equal(sl_buf_len(&f->b), 1u << 20);
	assert_int_equal(f->b.alloc, 1u << 20);
}

static void
test_wraparound_gives_two_iovecs_in_order(void **state)
{
	struct fx *f = *state;
	struct iovec iov[2];
	unsigned char out[8];

	/* cap 8 below the minimum step: alloc is exactly 8. */
	sl_buf_init(&f->b, 8);
	assert_int_equal(sl_buf_append(&f->b, "abcdef", 6), 0);
	assert_int_equal(f->b.alloc, 8);
	sl_buf_consume(&f->b, 4);                 /* "ef" at offsets 4-5 */
	assert_int_equal(sl_buf_append(&f->b, "ghijk", 5), 0); /* wraps */
	assert_int_equal(sl_buf_len(&f->b), 7);
	assert_int_equal(sl_buf_iov(&f->b, iov), 2);
	assert_int_equal(iov[0].iov_len, 4);
	assert_memory_equal(iov[0].iov_base, "efgh", 4);
	assert_int_equal(iov[1].iov_len, 3);
	assert_memory_equal(iov[1].iov_base, "ijk", 3);
	assert_int_equal(sl_buf_peek(&f->b, out, sizeof(out)), 7);
	assert_memory_equal(out, "efghijk", 7);
	/* Fill the last byte across the wrap, then the cap holds. */
	assert_int_equal(sl_buf_append(&f->b, "l", 1), 0);
	assert_int_equal(sl_buf_append(&f->b, "m", 1), -1);
	assert_int_equal(sl_buf_peek(&f->b, out, sizeof(out)), 8);
	assert_memory_equal(out, "efghijkl", 8);
	sl_buf_consume(&f->b, 5);
	assert_int_equal(sl_buf_peek(&f->b, out, sizeof(out)), 3);
	assert_memory_equal(out, "jkl", 3);
}

static void
test_grow_while_wrapped_keeps_order(void **state)
{
	struct fx *f = *state;
	unsigned char in[9000], out[9000];
	size_t i;

	for (i = 0; i < sizeof(in); i++)
		in[i] = stream_byte(i);
	sl_buf_init(&f->b, 16384);
	/* Fill the first allocation, consume some, wrap, then force growth. */
	assert_int_equal(sl_buf_append(&f->b, in, 3000), 0);
	sl_buf_consume(&f->b, 2500);
	assert_int_equal(sl_buf_append(&f->b, in + 3000, f->b.alloc - 500), 0);
	assert_int_equal(sl_buf_iov(&f->b, (struct iovec[2]){ { 0 } }), 2);
	i = 3000 + (f->b.alloc - 500);
	assert_int_equal(sl_buf_append(&f->b, in + i, 2000), 0);
	i += 2000;
	assert_int_equal(sl_buf_len(&f->b), i - 2500);
	assert_int_equal(flatten(&f->b, out), i - 2500);
	assert_memory_equal(out, in + 2500, i - 2500);
}

static void
test_consume_to_empty_resets(void **state)
{
	struct fx *f = *state;
	struct iovec iov[2];
	size_t alloc;

	sl_buf_init(&f->b, 8);
	assert_int_equal(sl_buf_append(&f->b, "abcdef", 6), 0);
	sl_buf_consume(&f->b, 3);
	sl_buf_consume(&f->b, 3);
	assert_int_equal(sl_buf_len(&f->b), 0);
	assert_int_equal(f->b.head, 0);
	assert_int_equal(sl_buf_iov(&f->b, iov), 0);
	alloc = f->b.alloc;
	/* Next bytes start at offset 0: one contiguous iovec, full capacity. */
	assert_int_equal(sl_buf_append(&f->b, "12345678", 8), 0);
	assert_int_equal(f->b.alloc, alloc);
	assert_int_equal(sl_buf_iov(&f->b, iov), 1);
	assert_ptr_equal(iov[0].iov_base, f->b.data);
	assert_memory_equal(iov[0].iov_base, "12345678", 8);
}

static void
test_peek_copies_without_consuming(void **state)
{
	struct fx *f = *state;
	char out[16];

	sl_buf_init(&f->b, 64);
	assert_int_equal(sl_buf_append(&f->b, "0123456789", 10), 0);
	memset(out, '#', sizeof(out));
	assert_int_equal(sl_buf_peek(&f->b, out, 4), 4);
	assert_memory_equal(out, "0123####", 8);
	assert_int_equal(sl_buf_len(&f->b), 10);
	assert_int_equal(sl_buf_peek(&f->b, out, sizeof(out)), 10);
	assert_memory_equal(out, "0123456789", 10);
	assert_int_equal(sl_buf_peek(&f->b, out, 0), 0);
	assert_int_equal(sl_buf_len(&f->b), 10);
}

static void
test_free_then_reuse(void **state)
{
	struct fx *f = *state;
	char out[4];

	sl_buf_init(&f->b, 64);
	assert_int_equal(sl_buf_append(&f->b, "abc", 3), 0);
	sl_buf_free(&f->b);
	assert_null(f->b.data);
	assert_int_equal(f->b.alloc, 0);
	assert_int_equal(sl_buf_len(&f->b), 0);
	assert_int_equal(f->b.cap, 64);
	assert_int_equal(sl_buf_append(&f->b, "xyz", 3), 0);
	assert_int_equal(sl_buf_peek(&f->b, out, sizeof(out)), 3);
	assert_memory_equal(out, "xyz", 3);
}

/*
 * Random appends and consumes against a plain array model: contents, order,
 * length and the cap must agree after every operation.
 */
static void
run_model(struct fx *f, size_t cap, uint64_t seed, int ops)
{
	uint64_t s = seed, wseq = 0, rseq = 0;
	unsigned char *in;
	size_t mlen = 0, n, i, a, c;
	int op, refused = 0, wrapped = 0, v, appendv = 0;
	struct iovec iov[2], pv[3];

	free(f->model);
	free(f->tmp);
	f->model = malloc(cap);
	f->tmp = malloc(cap + 1);
	assert_non_null(f->model);
	assert_non_null(f->tmp);
	in = f->tmp;
	sl_buf_free(&f->b);
	sl_buf_init(&f->b, cap);

	for (op = 0; op < ops; op++) {
		if (rnd(&s) % 2 == 0) {
			/* Mostly small appends, sometimes up to the whole cap. */
			n = rnd(&s) % 8 == 0 ? (size_t)(rnd(&s) % (cap + 1)) :
			    (size_t)(rnd(&s) % (cap / 8 + 1));
			for (i = 0; i < n; i++)
				in[i] = stream_byte(wseq + i);
			/* a third of the appends in three pieces (appendv) */
			v = rnd(&s) % 3 == 0;
			if (v) {
				a = n == 0 ? 0 : (size_t)(rnd(&s) % (n + 1));
				c = n - a == 0 ? 0 : (size_t)(rnd(&s) % (n - a + 1));
				pv[0].iov_base = in;
				pv[0].iov_len = a;
				pv[1].iov_base = in + a;
				pv[1].iov_len = c;
				pv[2].iov_base = in + a + c;
				pv[2].iov_len = n - a - c;
				appendv++;
			}
			if (n <= cap - mlen) {
				assert_int_equal(v ? sl_buf_appendv(&f->b, pv, 3) :
				    sl_buf_append(&f->b, in, n), 0);
				/* model holds bytes rseq.. contiguously */
				memcpy(f->model + mlen, in, n);
				mlen += n;
				wseq += n;
			} else {
				size_t alloc = f->b.alloc, head = f->b.head;
				char *data = f->b.data;

				assert_int_equal(v ? sl_buf_appendv(&f->b, pv, 3) :
				    sl_buf_append(&f->b, in, n), -1);
				assert_ptr_equal(f->b.data, data);
				assert_int_equal(f->b.alloc, alloc);
				assert_int_equal(f->b.head, head);
				refused++;
			}
		} else {
			n = mlen == 0 ? 0 : (size_t)(rnd(&s) % (mlen + 1));
			sl_buf_consume(&f->b, n);
			memmove(f->model, f->model + n, mlen - n);
			mlen -= n;
			rseq += n;
		}
		assert_int_equal(sl_buf_len(&f->b), mlen);
		assert_int_equal(sl_buf_space(&f->b), cap - mlen);
		assert_true(f->b.alloc <= cap);
		assert_true(mlen == 0 || f->b.alloc >= mlen);
		if (sl_buf_iov(&f->b, iov) == 2)
			wrapped++;
		assert_int_equal(flatten(&f->b, in), mlen);
		assert_memory_equal(in, f->model, mlen);
		if (mlen > 0) {
			n = (size_t)(rnd(&s) % mlen) + 1;
			assert_int_equal(sl_buf_peek(&f->b, in, n), n);
			assert_memory_equal(in, f->model, n);
		}
	}
	assert_int_equal(wseq - rseq, mlen);
	/* The run must have exercised the interesting paths. */
	assert_true(refused > 0);
	assert_true(appendv > 0);
	if (cap > 1)
		assert_true(wrapped > 0);
}

static void
test_random_ops_match_reference_model(void **state)
{
	static const size_t caps[] = { 1, 7, 100, 4096, 5000, 12345, 70000 };
	size_t i;

	for (i = 0; i < sizeof(caps) / sizeof(caps[0]); i++)
		run_model(*state, caps[i], 0x5eed0000u + i, 5000);
}

/*
 * A producer offering far more than the cap to a consumer that drains a
 * little at a time: the producer is refused (backpressure) instead of the
 * buffer growing, and every byte comes out once, in order.
 */
static void
test_slow_consumer_bounded_by_cap(void **state)
{
	struct fx *f = *state;
	const size_t cap = 16384, chunk = 1500, drain = 97;
	const uint64_t total = 2u << 20;
	unsigned char in[1500], out[97];
	uint64_t wseq = 0, rseq = 0;
	size_t n, i, max_alloc = 0;
	int refusals = 0;

	sl_buf_init(&f->b, cap);
	while (rseq < total) {
		/* The fast producer tries twice per round. */
		for (int k = 0; k < 2 && wseq < total; k++) {
			n = total - wseq < chunk ? (size_t)(total - wseq) : chunk;
			for (i = 0; i < n; i++)
				in[i] = stream_byte(wseq + i);
			if (sl_buf_append(&f->b, in, n) == 0)
				wseq += n;
			else
				refusals++;
		}
		if (f->b.alloc > max_alloc)
			max_alloc = f->b.alloc;
		assert_true(sl_buf_len(&f->b) <= cap);
		/* The slow consumer takes a little. */
		n = sl_buf_peek(&f->b, out, drain);
		for (i = 0; i < n; i++)
			if (out[i] != stream_byte(rseq + i)) {
				print_error("byte %llu differs\n",
				    (unsigned long long)(rseq + i));
				fail();
			}
		sl_buf_consume(&f->b, n);
		rseq += n;
	}
	assert_int_equal(wseq, total);
	assert_int_equal(rseq, total);
	assert_int_equal(sl_buf_len(&f->b), 0);
	assert_true(max_alloc <= cap);
	assert_true(refusals > 1000);
}

int
main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(test_init_allocates_nothing),
		T(test_append_iov_consume_in_order),
		T(test_append_exactly_cap_fits_one_more_refused),
		T(test_append_that_does_not_fit_is_all_or_nothing),
		T(test_append_larger_than_cap_allocates_nothing),
		T(test_small_cap_never_allocates_beyond_cap),
		T(test_growth_is_lazy_and_capped),
		T(test_wraparound_gives_two_iovecs_in_order),
		T(test_grow_while_wrapped_keeps_order),
		T(test_consume_to_empty_resets),
		T(test_peek_copies_without_consuming),
		T(test_free_then_reuse),
		T(test_random_ops_match_reference_model),
		T(test_slow_consumer_bounded_by_cap),
	};
#undef T

	return sl_unit_run(tests);
}
