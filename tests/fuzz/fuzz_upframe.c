/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * fuzz_upframe: a runner's answer through sluice's own upstream framing
 * (src/upframe.c), as issue 35 will read it from a socket.
 *
 * Input: byte 0: bit 0 the request was HEAD, bit 1 the runner closes after
 * its last byte (sl_upf_resp_eof), bit 2 the sink pauses on pieces the
 * seed picks; bytes 1-2 seed the read sizes; the rest is what the runner
 * sends. Heads are limited to MAX_HEAD bytes.
 *
 * 1. The answer is fed whole, then in reads of seed-chosen sizes (1-64
 *    bytes, the sink pausing as the seed says: the caller then feeds the
 *    rest later), and, when short, one byte per read. Every run must end
 *    the same: state, error class, status, reason, fields, body, framing,
 *    interim count, reusable, extra bytes (`split-differs`).
 * 2. An independent strict decoder (below, from the grammar sl_upframe.h
 *    documents; it shares no code with src/) reads the same bytes. Where it
 *    finds a complete answer, the framing must have found it too, with the
 *    same status, reason, filtered fields, body, reusable and extra
 *    (`ref-*`); where it refuses the bytes, the framing must fail
 *    (`ref-accepts-bad`); where it needs more bytes, the framing must be
 *    waiting (`ref-waiting`).
 * 3. Always: fields have token names and values without CTLs or outer
 *    blanks, none hop-by-hop, Content-Length or X-Accel-Buffering; a done
 *    answer's body_bytes is what the sink got; reusable implies HTTP/1.1,
 *    no extra and a known end (`shape`).
 */
#include "config.h"

#include <ctype.h>
#include <inttypes.h>
#include <limits.h>
#include <strings.h>

#include "sl_upframe.h"
#include "fuzz.h"

#define MAX_HEAD 512
#define MAX_INTERIM SL_UPF_MAX_INTERIM

/* ---- one run of the framing ---- */

struct outcome {
	enum sl_upf_state state;
	enum sl_upf_error error;
	int status;
	char reason[64];
	struct fz_buf fields;       /* "name: value\n" */
	struct fz_buf body;
	enum sl_upf_framing framing;
	unsigned interim;
	int reusable;
	uint64_t extra;
	uint64_t body_bytes;
};

struct sinkst {
	struct fz_buf *body;
	uint32_t *seed;             /* NULL: never pause */
};

static int
sink(void *arg, const char *p, size_t n)
{
	struct sinkst *s = arg;

	fz_check(n > 0, "shape", "an empty piece");
	fz_add(s->body, p, n);
	if (s->seed != NULL && fz_rand(s->seed) % 3 == 0)
		return SL_UPF_PAUSE;
	return SL_UPF_GO;
}

/* step 0: whole; 1: one byte per read; else seed-chosen reads. */
static void
run(const char *in, size_t len, int head, int eof, int step, uint32_t seed,
    int pause, struct outcome *o)
{
	struct sl_upf_resp r;
	struct sinkst st;
	uint32_t ps = seed ^ 0x9e3779b9u;
	size_t pos = 0, have = 0, n, spins = 0, i;
	const char *name, *value;
	size_t nl, vl;

	memset(o, 0, sizeof(*o));
	st.body = &o->body;
	st.seed = pause ? &ps : NULL;
	sl_upf_resp_init(&r, MAX_HEAD, head, sink, &st);
	for (;;) {
		if (pos == have) {
			if (have == len)
				break;
			if (step == 0)
				have = len;
			else if (step == 1)
				have++;
			else
				have += 1 + fz_rand(&seed) % 64;
			if (have > len)
				have = len;
		}
		if (r.state == SL_UPF_DONE) {
			fz_check(sl_upf_resp_feed(&r, in + pos, have - pos) == 0,
			    "shape", "bytes consumed after DONE");
			pos = have;
			continue;
		}
		n = sl_upf_resp_feed(&r, in + pos, have - pos);
		fz_check(n <= have - pos, "shape", "consumed more than given");
		pos += n;
		if (r.state == SL_UPF_HEAD_DONE)
			sl_upf_resp_continue(&r);
		else if (r.state == SL_UPF_ERROR)
			break;
		else if (r.state == SL_UPF_DONE)
			pos = have;   /* the feed counted them as extra */
		else if (n == 0 && !(pause && pos < have))
			fz_check(0, "stall", "a feed took nothing in state %d",
			    r.state);
		fz_check(++spins < 4 * len + 100, "stall", "no progress");
	}
	if (eof && r.state != SL_UPF_ERROR)
		sl_upf_resp_eof(&r);
	o->state = r.state;
	o->error = r.error;
	if (r.state == SL_UPF_ERROR) {
		fz_check(r.why != NULL, "shape", "an error without a reason");
	} else {
		o->status = r.status;
		memcpy(o->reason, r.reason, sizeof(o->reason));
		o->framing = r.framing;
		o->interim = r.interim;
	}
	if (r.state == SL_UPF_DONE || r.state == SL_UPF_BODY) {
		for (i = 0; sl_upf_fields_at(&r.fields, i, &name, &nl, &value,
		    &vl) == 0; i++) {
			fz_add(&o->fields, name, nl);
			fz_add(&o->fields, ": ", 2);
			fz_add(&o->fields, value, vl);
			fz_add(&o->fields, "\n", 1);
		}
	}
	if (r.state == SL_UPF_DONE) {
		o->reusable = r.reusable;
		o->extra = r.extra;
	}
	o->body_bytes = r.body_bytes;
	sl_upf_resp_free(&r);
}

static void
outcome_free(struct outcome *o)
{
	fz_free(&o->fields);
	fz_free(&o->body);
}

static int
buf_eq(const struct fz_buf *a, const struct fz_buf *b)
{
	return a->len == b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
}

static void
same(const struct outcome *a, const struct outcome *b, const char *how)
{
	int ok = a->state == b->state && a->error == b->error &&
	    a->status == b->status && strcmp(a->reason, b->reason) == 0 &&
	    buf_eq(&a->fields, &b->fields) && buf_eq(&a->body, &b->body) &&
	    a->framing == b->framing && a->interim == b->interim &&
	    a->reusable == b->reusable && a->extra == b->extra;

	if (!ok) {
		fprintf(stderr, "whole: state %d error %d status %d body %zu "
		    "reusable %d extra %" PRIu64 "\n%s: state %d error %d status %d "
		    "body %zu reusable %d extra %" PRIu64 "\n", a->state, a->error,
		    a->status, a->body.len, a->reusable, a->extra, how, b->state,
		    b->error, b->status, b->body.len, b->reusable, b->extra);
		fz_dump("whole fields", a->fields.p, a->fields.len);
		fz_dump("split fields", b->fields.p, b->fields.len);
	}
	fz_check(ok, "split-differs", "fed %s, the answer differs", how);
}

/* ---- the reference: a strict decoder of the documented grammar ---- */

enum { R_WAIT = 0, R_DONE, R_BAD };

struct ref {
	int verdict;
	int status;
	char reason[64];
	struct fz_buf fields;
	struct fz_buf body;
	int reusable;
	uint64_t extra;
};

static int
ref_ctl(unsigned char ch)
{
	return (ch < 0x20 && ch != '\t') || ch == 0x7f;
}

/*
 * The line at *pos (EOL: CRLF or LF): *l its start, *ll its length without
 * EOL; *pos moves past it. R_WAIT: no EOL yet (*ll: the bytes there are,
 * a final lone CR left out); R_BAD: a CR not right before a LF.
 */
static int
ref_line(const unsigned char *p, size_t n, size_t *pos,
    const unsigned char **l, size_t *ll)
{
	size_t i;

	*l = p + *pos;
	for (i = *pos; i < n; i++) {
		if (p[i] == '\n') {
			*ll = i - *pos;
			*pos = i + 1;
			return R_DONE;
		}
		if (p[i] == '\r') {
			if (i + 1 == n) {
				*ll = i - *pos;
				return R_WAIT;
			}
			if (p[i + 1] != '\n')
				return R_BAD;
			*ll = i - *pos;
			*pos = i + 2;
			return R_DONE;
		}
	}
	*ll = n - *pos;
	return R_WAIT;
}

static const char *const ref_dropped[] = {
	"connection", "keep-alive", "proxy-connection", "proxy-authenticate",
	"proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
	"content-length", "x-accel-buffering", NULL
};

static int
ref_name_is(const unsigned char *name, size_t nl, const char *want)
{
	return strlen(want) == nl && strncasecmp((const char *)name, want, nl) == 0;
}

/* One head's (or trailer's) facts, from its field lines. */
struct ref_head {
	int cl_lines, te_lines;
	long long cl;
	int close, keepalive;       /* http-parser's reading of Connection */
	/*
	 * http-parser's reading of Transfer-Encoding (as Debian patches it):
	 * any name that starts with it counts as one and clears chunked; an
	 * exact one sets it when its value is "chunked" and spaces.
	 */
	int uses_te, http_chunked;
	char conn[256];             /* sluice's: ",a,b," */
	size_t conn_len;
	int conn_over;              /* the names would not fit sluice's 128 */
};

/*
 * http-parser's Content-Length digits: OWS, digits, then spaces only,
 * its overflow test; complete: the value must not be empty. 0 or -1.
 */
static int
ref_cl_chars(const unsigned char *v, size_t n, int complete)
{
	unsigned long long cl = 0;
	size_t i = 0;
	int digits = 0, ws = 0;

	while (i < n && (v[i] == ' ' || v[i] == '\t'))
		i++;
	for (; i < n; i++) {
		if (v[i] == ' ') {
			if (digits)
				ws = 1;
			continue;
		}
		if (v[i] < '0' || v[i] > '9' || ws)
			return -1;
		if ((ULLONG_MAX - 10) / 10 < cl)
			return -1;
		cl = cl * 10 + (unsigned long long)(v[i] - '0');
		digits++;
	}
	return complete && digits == 0 ? -1 : 0;
}

/* As http-parser matches a token list for one word (close, keep-alive). */
static int
ref_token_listed(const unsigned char *v, size_t n, const char *word)
{
	size_t i = 0, s, e, wl = strlen(word);

	while (i <= n) {
		while (i < n && (v[i] == ' ' || v[i] == '\t'))
			i++;
		s = i;
		while (i < n && v[i] != ',')
			i++;
		e = i;
		while (e > s && v[e - 1] == ' ')
			e--;
		if (e - s == wl && strncasecmp((const char *)v + s, word, wl) == 0)
			return 1;
		i++;
	}
	return 0;
}

/* A field line, or the start of one (complete 0); -1 if bad. */
static int
ref_field(struct ref_head *h, const unsigned char *l, size_t ll, int complete,
    const unsigned char **nm, size_t *nlp, const unsigned char **vp,
    size_t *vlp)
{
	size_t i = 0, nl, vs, ve, raw;

	if (ll > 0 && (l[0] == ' ' || l[0] == '\t'))
		return -1;   /* obs-fold */
	while (i < ll && fz_tchar(l[i]))
		i++;
	if (i < ll && (l[i] != ':' || i == 0))
		return -1;
	if (i == ll)
		return complete ? -1 : 0;
	nl = i++;
	raw = i;
	for (; i < ll; i++)
		if (ref_ctl(l[i]))
			return -1;
	i = raw;
	while (i < ll && (l[i] == ' ' || l[i] == '\t'))
		i++;
	vs = i;
	ve = ll;
	if (ref_name_is(l, nl, "content-length")) {
		/* http-parser: at the value's first byte, a second one fails. */
		if ((h->cl_lines > 0 && vs < ll) ||
		    ref_cl_chars(l + raw, ll - raw, 0) == -1)
			return -1;
		/*
		 * An empty one (or a second one, empty) fails only when the
		 * byte after its line comes.
		 */
		if (complete && (vs == ll || h->cl_lines > 0))
			return -3;
	}
	if (!complete)
		return 0;
	while (ve > vs && (l[ve - 1] == ' ' || l[ve - 1] == '\t'))
		ve--;
	*nm = l;
	*nlp = nl;
	*vp = l + vs;
	*vlp = ve - vs;
	if (ref_name_is(l, nl, "content-length")) {
		long long v = 0;

		h->cl_lines++;
		if (ve - vs > 18)
			return -2;   /* sluice's rule, at the end of the head */
		for (i = vs; i < ve; i++)
			v = v * 10 + (l[i] - '0');
		h->cl = v;
	}
	if (nl >= 17 && strncasecmp((const char *)l, "transfer-encoding",
	    17) == 0) {
		size_t e = ll;

		h->uses_te = 1;
		h->http_chunked = 0;
		/* http-parser: "chunked" and spaces; sluice also trims HTAB. */
		while (e > vs && l[e - 1] == ' ')
			e--;
		if (nl == 17) {
			h->te_lines++;
			h->http_chunked = e - vs == 7 &&
			    strncasecmp((const char *)l + vs, "chunked", 7) == 0;
		}
	}
	if (ref_name_is(l, nl, "connection") ||
	    ref_name_is(l, nl, "proxy-connection")) {
		if (ref_token_listed(l + vs, ll - vs, "close"))
			h->close = 1;
		if (ref_token_listed(l + vs, ll - vs, "keep-alive"))
			h->keepalive = 1;
	}
	if (ref_name_is(l, nl, "connection")) {
		size_t s, e;

		for (i = vs; i < ve;) {
			while (i < ve && (l[i] == ',' || l[i] == ' ' || l[i] == '\t'))
				i++;
			s = i;
			while (i < ve && l[i] != ',' && l[i] != ' ' && l[i] != '\t')
				i++;
			e = i;
			if (e == s)
				continue;
			if (h->conn_len + (e - s) + 2 > 128) {
				h->conn_over = 1;
				break;
			}
			if (h->conn_len == 0)
				h->conn[h->conn_len++] = ',';
			for (; s < e; s++)
				h->conn[h->conn_len++] = (char)tolower(l[s]);
			h->conn[h->conn_len++] = ',';
		}
	}
	return 0;
}

static int
ref_conn_named(const struct ref_head *h, const unsigned char *name, size_t nl)
{
	char want[140];
	size_t i;

	if (h->conn_len == 0 || nl + 2 > sizeof(want))
		return 0;
	want[0] = ',';
	for (i = 0; i < nl; i++)
		want[i + 1] = (char)tolower(name[i]);
	want[nl + 1] = ',';
	for (i = 0; i + nl + 2 <= h->conn_len; i++)
		if (memcmp(h->conn + i, want, nl + 2) == 0)
			return 1;
	return 0;
}

static int
ref_drop(const unsigned char *name, size_t nl)
{
	size_t i;

	for (i = 0; ref_dropped[i] != NULL; i++)
		if (ref_name_is(name, nl, ref_dropped[i]))
			return 1;
	return 0;
}

/* "HTTP/" DIGIT "." DIGIT SP 3DIGIT [ SP reason ], or a prefix of it. */
static int
ref_status_line(const unsigned char *l, size_t ll, int complete)
{
	static const char pat[] = "HTTP/d.d ddd";
	size_t i;

	for (i = 0; i < ll; i++)
		if (ref_ctl(l[i]))
			return -1;
	for (i = 0; i < ll && i < 12; i++) {
		if (pat[i] == 'd' ? !isdigit(l[i]) : l[i] != (unsigned char)pat[i])
			return -1;
	}
	if (ll > 12 && l[12] != ' ')
		return -1;
	return complete && ll < 12 ? -1 : 0;
}

/*
 * A head at *pos: R_DONE with *pos after it, or R_WAIT / R_BAD. Fills h,
 * status, http minor, reason and the fields sluice keeps.
 */
static int
ref_head(const unsigned char *p, size_t n, size_t *pos, struct ref_head *h,
    int *status, int *minor, char reason[64], struct fz_buf *fields)
{
	size_t start = *pos, ll, i, k, nfl = 0, nlen, vlen;
	const unsigned char *l, *nm, *v;
	const unsigned char *fl[512], *flvp[512];
	size_t fln[512], flv[512];
	int rc, later_bad = 0, r;

	memset(h, 0, sizeof(*h));
	/* Empty lines before the status line are skipped. */
	for (;;) {
		if (*pos < n && p[*pos] == '\n')
			(*pos)++;
		else if (*pos + 1 < n && p[*pos] == '\r' && p[*pos + 1] == '\n')
			*pos += 2;
		else if (*pos + 1 < n && p[*pos] == '\r')
			return R_BAD;
		else if (*pos + 1 == n && p[*pos] == '\r')
			return n - start > MAX_HEAD ? R_BAD : R_WAIT;
		else
			break;
		if (*pos - start > MAX_HEAD)
			return R_BAD;
	}
	rc = ref_line(p, n, pos, &l, &ll);
	if (rc == R_BAD)
		return R_BAD;
	/* A CR ends the line's content: only its LF is missing. */
	if (ref_status_line(l, ll, rc == R_DONE ||
	    (size_t)(l - p) + ll < n) == -1)
		return R_BAD;
	if (rc == R_WAIT)
		return n - start > MAX_HEAD ? R_BAD : R_WAIT;
	if (*pos - start > MAX_HEAD)
		return R_BAD;
	/* Not HTTP/1.x: refused once the head is whole (UNSUPPORTED). */
	later_bad = l[5] != '1';
	*minor = l[7] - '0';
	*status = (l[9] - '0') * 100 + (l[10] - '0') * 10 + (l[11] - '0');
	i = 12;
	while (i < ll && l[i] == ' ')
		i++;
	for (k = 0; i < ll && k < 63; i++, k++)
		reason[k] = (l[i] >= 0x20 && l[i] < 0x7f) ? (char)l[i] : ' ';
	reason[k] = '\0';
	for (;;) {
		rc = ref_line(p, n, pos, &l, &ll);
		if (rc == R_BAD)
			return R_BAD;
		if (rc == R_WAIT) {
			r = ll == 0 ? 0 : ref_field(h, l, ll,
			    (size_t)(l - p) + ll < n, &nm, &nlen, &v, &vlen);
			if (r == -1)
				return R_BAD;
			return n - start > MAX_HEAD ? R_BAD : R_WAIT;
		}
		if (*pos - start > MAX_HEAD)
			return R_BAD;
		if (ll == 0)
			break;
		r = ref_field(h, l, ll, 1, &nm, &nlen, &v, &vlen);
		if (r == -3) {
			if (*pos < n)
				return R_BAD;
			return n - start >= MAX_HEAD ? R_BAD : R_WAIT;
		}
		if (r == -1)
			return R_BAD;
		if (r == -2)
			later_bad = 1;
		if (nfl < 512) {
			fl[nfl] = nm;
			fln[nfl] = nlen;
			flvp[nfl] = v;
			flv[nfl] = vlen;
			nfl++;
		}
	}
	/*
	 * http-parser: Content-Length with Transfer-Encoding; sluice: the
	 * codings and names it takes, and the status.
	 */
	if (later_bad || (h->cl_lines && h->uses_te) || h->te_lines > 1 ||
	    h->conn_over || *status < 100 || *status == 101)
		return R_BAD;
	for (i = 0; i < nfl; i++) {
		if (ref_name_is(fl[i], fln[i], "transfer-encoding") &&
		    !(flv[i] == 7 && strncasecmp((const char *)flvp[i],
		    "chunked", 7) == 0))
			return R_BAD;
	}
	/* Both read it as chunked, or sluice refuses the head. */
	if ((h->te_lines > 0) != h->http_chunked)
		return R_BAD;
	for (i = 0; i < nfl; i++) {
		if (ref_drop(fl[i], fln[i]) || ref_conn_named(h, fl[i], fln[i]))
			continue;
		fz_add(fields, fl[i], fln[i]);
		fz_add(fields, ": ", 2);
		fz_add(fields, flvp[i], flv[i]);
		fz_add(fields, "\n", 1);
	}
	return R_DONE;
}

/*
 * A chunked body from *pos; R_DONE with *pos after its last CRLF. *close:
 * http-parser reads the trailer's Connection and Transfer-Encoding too.
 */
static int
ref_chunked(const unsigned char *p, size_t n, size_t *pos, struct fz_buf *body,
    int *close)
{
	size_t start, ll, nlen, vlen;
	const unsigned char *nm, *v, *l;
	struct ref_head th;
	int rc;

	for (;;) {
		size_t s = *pos, i = *pos, digits = 0;
		uint64_t sz = 0;
		int h;

		/* The size line: at most SL_UPF_CHUNK_LINE_MAX bytes, CRLF too. */
		for (; i < n; i++) {
			if (i - s + 1 > SL_UPF_CHUNK_LINE_MAX)
				return R_BAD;
			if (isdigit(p[i]))
				h = p[i] - '0';
			else if (p[i] >= 'a' && p[i] <= 'f')
				h = p[i] - 'a' + 10;
			else if (p[i] >= 'A' && p[i] <= 'F')
				h = p[i] - 'A' + 10;
			else
				break;
			if (sz >= ((uint64_t)1 << 56))
				return R_BAD;
			sz = sz * 16 + (uint64_t)h;
			digits++;
		}
		if (i == n)
			return R_WAIT;
		if (digits == 0)
			return R_BAD;
		/* http-parser takes SP or ';' before extensions, not HTAB. */
		if (p[i] == ';' || p[i] == ' ') {
			for (; i < n && p[i] != '\r'; i++) {
				if (i - s + 1 > SL_UPF_CHUNK_LINE_MAX ||
				    ref_ctl(p[i]))
					return R_BAD;
			}
		} else if (p[i] != '\r')
			return R_BAD;
		if (i == n)
			return R_WAIT;
		if (i - s + 1 > SL_UPF_CHUNK_LINE_MAX)
			return R_BAD;
		if (i + 1 == n)
			return R_WAIT;
		if (p[i + 1] != '\n' || i - s + 2 > SL_UPF_CHUNK_LINE_MAX)
			return R_BAD;
		*pos = i + 2;
		if (sz == 0)
			break;
		if (n - *pos < sz) {
			fz_add(body, p + *pos, n - *pos);
			return R_WAIT;
		}
		fz_add(body, p + *pos, (size_t)sz);
		*pos += (size_t)sz;
		if (*pos == n)
			return R_WAIT;
		if (p[*pos] != '\r')
			return R_BAD;
		if (*pos + 1 == n)
			return R_WAIT;
		if (p[*pos + 1] != '\n')
			return R_BAD;
		*pos += 2;
	}
	/* The trailer section: field lines, then an empty line; dropped. */
	start = *pos;
	memset(&th, 0, sizeof(th));
	th.http_chunked = 1;
	for (;;) {
		rc = ref_line(p, n, pos, &l, &ll);
		if (rc == R_BAD)
			return R_BAD;
		if (rc == R_WAIT) {
			rc = ll == 0 ? 0 : ref_field(&th, l, ll,
			    (size_t)(l - p) + ll < n, &nm, &nlen, &v, &vlen);
			if (rc == -1)
				return R_BAD;
			return n - start > MAX_HEAD ? R_BAD : R_WAIT;
		}
		if (*pos - start > MAX_HEAD)
			return R_BAD;
		if (ll == 0)
			break;
		rc = ref_field(&th, l, ll, 1, &nm, &nlen, &v, &vlen);
		if (rc == -3) {
			if (*pos < n)
				return R_BAD;
			return n - start >= MAX_HEAD ? R_BAD : R_WAIT;
		}
		if (rc == -1)
			return R_BAD;
	}
	/* http-parser then wants an EOF: not reusable. */
	if (th.close || !th.http_chunked)
		*close = 1;
	return R_DONE;
}

static void
ref_decode(const unsigned char *p, size_t n, int head, int eof, struct ref *o)
{
	size_t pos = 0;
	unsigned interim = 0;
	struct ref_head h;
	int status = 0, minor = 0, rc, close;

	memset(o, 0, sizeof(*o));
	for (;;) {
		o->fields.len = 0;
		rc = ref_head(p, n, &pos, &h, &status, &minor, o->reason,
		    &o->fields);
		if (rc == R_WAIT && eof)
			rc = R_BAD;
		if (rc != R_DONE) {
			o->verdict = rc;
			return;
		}
		if (status >= 200)
			break;
		if (++interim > MAX_INTERIM) {
			o->verdict = R_BAD;
			return;
		}
		/*
		 * An interim head's Connection: close is not the answer's
		 * (http-parser built lax starts the next head either way).
		 */
	}
	o->status = status;
	close = h.close;
	if (head || status == 204 || status == 304 ||
	    (!h.te_lines && h.cl_lines && h.cl == 0)) {
		o->verdict = R_DONE;
	} else if (h.te_lines) {
		rc = ref_chunked(p, n, &pos, &o->body, &close);
		if (rc == R_WAIT && eof)
			rc = R_BAD;
		o->verdict = rc;
	} else if (h.cl_lines) {
		if (n - pos >= (size_t)h.cl) {
			fz_add(&o->body, p + pos, (size_t)h.cl);
			pos += (size_t)h.cl;
			o->verdict = R_DONE;
		} else {
			fz_add(&o->body, p + pos, n - pos);
			o->verdict = eof ? R_BAD : R_WAIT;
		}
	} else {
		fz_add(&o->body, p + pos, n - pos);
		pos = n;
		o->verdict = eof ? R_DONE : R_WAIT;
		close = 1;
	}
	if (o->verdict != R_DONE)
		return;
	o->extra = n - pos;
	o->reusable = minor >= 1 && !close && o->extra == 0 && !eof;
}

/* ---- invariants on any outcome ---- */

static void
shape(const struct outcome *o, const char *in, size_t len)
{
	const unsigned char *f = o->fields.p, *end = f == NULL ? f :
	    f + o->fields.len;

	(void)in;
	(void)len;
	while (f < end) {
		const unsigned char *eol = memchr(f, '\n', (size_t)(end - f));
		const unsigned char *c = memchr(f, ':', (size_t)(eol - f));
		const unsigned char *q;

		fz_check(c != NULL && c > f, "shape", "a field without a name");
		for (q = f; q < c; q++)
			fz_check(fz_tchar(*q), "shape", "a name byte 0x%02x", *q);
		fz_check(!ref_drop(f, (size_t)(c - f)), "shape",
		    "a dropped field was kept");
		q = c + 2;
		fz_check(q == eol || (*q != ' ' && *q != '\t' && eol[-1] != ' ' &&
		    eol[-1] != '\t'), "shape", "blanks around a value");
		for (; q < eol; q++)
			fz_check(!ref_ctl(*q), "shape", "a CTL in a value");
		f = eol + 1;
	}
	fz_check(o->body_bytes == o->body.len, "shape", "body_bytes %" PRIu64
	    " but the sink got %zu", o->body_bytes, o->body.len);
	if (o->state == SL_UPF_DONE && o->reusable)
		fz_check(o->extra == 0 && o->framing != SL_UPF_UNTIL_CLOSE,
		    "shape", "reusable with extra bytes or no known end");
	if (o->state == SL_UPF_ERROR)
		fz_check(o->error != SL_UPF_E_NONE, "shape", "an error without a class");
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct outcome whole, split, bytes;
	struct ref ref;
	const char *in;
	size_t len;
	uint32_t seed;
	int head, eof, pause;

	if (size < 3)
		return 0;
	head = data[0] & 1;
	eof = (data[0] >> 1) & 1;
	pause = (data[0] >> 2) & 1;
	seed = ((uint32_t)data[1] << 8 | data[2]) * 2654435761u | 1;
	in = (const char *)data + 3;
	len = size - 3;

	run(in, len, head, eof, 0, seed, 0, &whole);
	shape(&whole, in, len);
	run(in, len, head, eof, 2, seed, pause, &split);
	shape(&split, in, len);
	same(&whole, &split, "in seed-chosen reads");
	if (len <= 2048) {
		run(in, len, head, eof, 1, seed, pause, &bytes);
		same(&whole, &bytes, "one byte per read");
		outcome_free(&bytes);
	}

	ref_decode((const unsigned char *)in, len, head, eof, &ref);
	switch (ref.verdict) {
	case R_DONE:
		if (whole.state != SL_UPF_DONE)
			fz_dump("answer", in, len);
		fz_check(whole.state == SL_UPF_DONE, "ref-done",
		    "the reference read a whole answer; the framing: state %d "
		    "error %d", whole.state, whole.error);
		fz_check(whole.status == ref.status, "ref-status", "%d vs %d",
		    whole.status, ref.status);
		fz_check(strcmp(whole.reason, ref.reason) == 0, "ref-reason",
		    "'%s' vs '%s'", whole.reason, ref.reason);
		if (!buf_eq(&whole.fields, &ref.fields)) {
			fz_dump("framing's fields", whole.fields.p, whole.fields.len);
			fz_dump("reference's fields", ref.fields.p, ref.fields.len);
		}
		fz_check(buf_eq(&whole.fields, &ref.fields), "ref-fields",
		    "fields differ");
		fz_check(buf_eq(&whole.body, &ref.body), "ref-body",
		    "body %zu vs %zu bytes", whole.body.len, ref.body.len);
		fz_check(whole.reusable == ref.reusable, "ref-reusable",
		    "%d vs %d", whole.reusable, ref.reusable);
		fz_check(whole.extra == ref.extra, "ref-extra", "%" PRIu64
		    " vs %" PRIu64, whole.extra, ref.extra);
		break;
	case R_BAD:
		if (whole.state != SL_UPF_ERROR)
			fz_dump("answer", in, len);
		fz_check(whole.state == SL_UPF_ERROR, "ref-accepts-bad",
		    "the reference refuses the answer; the framing: state %d",
		    whole.state);
		break;
	default:
		if (whole.state == SL_UPF_ERROR || whole.state == SL_UPF_DONE)
			fz_dump("answer", in, len);
		fz_check(whole.state == SL_UPF_HEAD ||
		    whole.state == SL_UPF_BODY, "ref-waiting",
		    "the reference waits for more; the framing: state %d error %d",
		    whole.state, whole.error);
		if (whole.state == SL_UPF_BODY)
			fz_check(buf_eq(&whole.body, &ref.body), "ref-body",
			    "partial body %zu vs %zu bytes", whole.body.len,
			    ref.body.len);
		break;
	}
	fz_free(&ref.fields);
	fz_free(&ref.body);
	outcome_free(&whole);
	outcome_free(&split);
	return 0;
}
