/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * The listener's TLS: OpenSSL 3 contexts made from `tls:`, and the
 * non-blocking transport calls of one connection (sl_tls.h).
 */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "sl_shm.h"
#include "sl_tls.h"

/* Warn when the leaf expires within this. */
#define EXPIRY_WARN_DAYS 14

_Static_assert(SL_TLS_E_MAX == SL_STAT_TLS_ERRS, "sl_shm.h counts each reason of enum sl_tls_err");

static const char *const err_names[SL_TLS_E_MAX] = {
	"http_request", "version", "cipher", "alpn", "sni", "alert", "eof",
	"timeout", "other"
};

const char *
sl_tls_err_name(enum sl_tls_err e)
{
	return (unsigned)e < SL_TLS_E_MAX ? err_names[e] : "other";
}

/* The last OpenSSL error as text (and the queue emptied). */
static const char *
ossl_reason(void)
{
	static char buf[256];
	unsigned long e = ERR_peek_last_error();

	if (e == 0)
		snprintf(buf, sizeof(buf), "unknown error");
	else
		ERR_error_string_n(e, buf, sizeof(buf));
	ERR_clear_error();
	return buf;
}

static void
asn1_date(const ASN1_TIME *t, char *out, size_t len)
{
	struct tm tm;

	if (ASN1_TIME_to_tm(t, &tm) != 1 ||
	    strftime(out, len, "%Y-%m-%d %H:%M:%S UTC", &tm) == 0)
		snprintf(out, len, "(unreadable date)");
}

/*
 * ALPN: the first protocol of ours (in tls.alpn order) the client offers;
 * none in common is refused (no_application_protocol). arg carries our
 * list: alpn[0] | alpn[1] << 4.
 */
static int
alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
    const unsigned char *in, unsigned int inlen, void *arg)
{
	uintptr_t prefs = (uintptr_t)arg;
	int k;

	(void)ssl;
	for (k = 0; k < 2; k++) {
		int p = (int)((prefs >> (4 * k)) & 0xf);
		const char *name;
		unsigned int i, nlen;

		if (p == SL_ALPN_NONE)
			break;
		name = p == SL_ALPN_H2 ? "h2" : "http/1.1";
		nlen = p == SL_ALPN_H2 ? 2 : 8;
		for (i = 0; i < inlen; i += 1u + in[i])
			if (in[i] == nlen && i + 1 + nlen <= inlen &&
			    memcmp(in + i + 1, name, nlen) == 0) {
				*out = in + i + 1;
				*outlen = (unsigned char)nlen;
				return SSL_TLSEXT_ERR_OK;
			}
	}
	return SSL_TLSEXT_ERR_ALERT_FATAL;
}

/* A server name the leaf does not cover is refused (unrecognized_name). */
static int
sni_ok(SSL *ssl)
{
	const char *name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
	X509 *leaf;

	if (name == NULL)
		return 1;   /* no SNI (a client dialling an address) */
	leaf = SSL_get_certificate(ssl);
	return leaf != NULL && X509_check_host(leaf, name, 0, 0, NULL) == 1;
}

static int
sni_select(SSL *ssl, int *al, void *arg)
{
	(void)arg;
	if (sni_ok(ssl))
		return SSL_TLSEXT_ERR_OK;
	*al = SSL_AD_UNRECOGNIZED_NAME;
	return SSL_TLSEXT_ERR_ALERT_FATAL;
}

void *
sl_tls_ctx_new(const struct sl_tls_conf *conf, char *err, size_t errlen,
    char *warn, size_t warnlen)
{
	SSL_CTX *ctx;
	X509 *leaf;
	FILE *fp;
	struct stat st;
	char date[64];
	time_t soon;
	int v13 = conf->min_version != NULL &&
	    strcmp(conf->min_version, "TLSv1.3") == 0;

	warn[0] = '\0';
	/* Readable at all: errno says it better than a PEM error does. */
	if ((fp = fopen(conf->cert, "r")) == NULL) {
		snprintf(err, errlen, "tls.cert: %s: %s", conf->cert,
		    strerror(errno));
		return NULL;
	}
	fclose(fp);
	if ((fp = fopen(conf->key, "r")) == NULL) {
		snprintf(err, errlen, "tls.key: %s: %s", conf->key,
		    strerror(errno));
		return NULL;
	}
	fclose(fp);
	ERR_clear_error();
	if ((ctx = SSL_CTX_new(TLS_server_method())) == NULL) {
		snprintf(err, errlen, "tls: cannot make a context: %s",
		    ossl_reason());
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, v13 ? TLS1_3_VERSION : TLS1_2_VERSION);
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION |
	    SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_NO_COMPRESSION);
	/*
	 * Partial writes and a moving buffer: a flush hands over what its
	 * buffer holds and retries with the same bytes, maybe at another
	 * address. Release buffers: an idle connection keeps no 34 KiB.
	 */
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
	    SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
	SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"sluice", 6);
	if (SSL_CTX_use_certificate_chain_file(ctx, conf->cert) != 1) {
		snprintf(err, errlen, "tls.cert: %s: not a PEM certificate "
		    "chain: %s", conf->cert, ossl_reason());
		goto fail;
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, conf->key, SSL_FILETYPE_PEM) != 1) {
		if (ERR_GET_REASON(ERR_peek_last_error()) ==
		    X509_R_KEY_VALUES_MISMATCH) {
			ERR_clear_error();
			snprintf(err, errlen, "tls.key: %s does not match the "
			    "certificate in %s", conf->key, conf->cert);
		} else
			snprintf(err, errlen, "tls.key: %s: not a PEM private "
			    "key: %s", conf->key, ossl_reason());
		goto fail;
	}
	if (SSL_CTX_check_private_key(ctx) != 1) {
		ERR_clear_error();
		snprintf(err, errlen, "tls.key: %s does not match the "
		    "certificate in %s", conf->key, conf->cert);
		goto fail;
	}
	leaf = SSL_CTX_get0_certificate(ctx);
	if (X509_cmp_current_time(X509_get0_notAfter(leaf)) <= 0) {
		asn1_date(X509_get0_notAfter(leaf), date, sizeof(date));
		snprintf(err, errlen, "tls.cert: %s expired on %s", conf->cert,
		    date);
		goto fail;
	}
	if (X509_cmp_current_time(X509_get0_notBefore(leaf)) >= 0) {
		asn1_date(X509_get0_notBefore(leaf), date, sizeof(date));
		snprintf(err, errlen, "tls.cert: %s is not valid before %s",
		    conf->cert, date);
		goto fail;
	}
	soon = time(NULL) + EXPIRY_WARN_DAYS * 86400;
	if (X509_cmp_time(X509_get0_notAfter(leaf), &soon) < 0) {
		asn1_date(X509_get0_notAfter(leaf), date, sizeof(date));
		snprintf(warn, warnlen, "tls.cert: %s expires on %s, within %d "
		    "days", conf->cert, date, EXPIRY_WARN_DAYS);
	}
	if (stat(conf->key, &st) == 0 && (st.st_mode & S_IROTH)) {
		size_t n = strlen(warn);

		snprintf(warn + n, warnlen - n, "%s%s holds the TLS private key "
		    "and is readable by others (chmod o-r)", n > 0 ? "; " : "",
		    conf->key);
	}
	SSL_CTX_set_alpn_select_cb(ctx, alpn_select,
	    (void *)(uintptr_t)((unsigned)conf->alpn[0] |
	    ((unsigned)conf->alpn[1] << 4)));
	SSL_CTX_set_tlsext_servername_callback(ctx, sni_select);
	ERR_clear_error();
	return ctx;
fail:
	SSL_CTX_free(ctx);
	ERR_clear_error();
	return NULL;
}

void
sl_tls_ctx_free(void *ctx)
{
	SSL_CTX_free(ctx);
}

void *
sl_tls_new(void *ctx, int fd)
{
	SSL *ssl = SSL_new(ctx);

	if (ssl == NULL) {
		ERR_clear_error();
		return NULL;
	}
	if (SSL_set_fd(ssl, fd) != 1) {
		SSL_free(ssl);
		ERR_clear_error();
		return NULL;
	}
	SSL_set_accept_state(ssl);
	return ssl;
}

void
sl_tls_free(void *ssl)
{
	SSL_free(ssl);
}

/* Why the handshake of ssl failed, from the error queue (then emptied). */
static enum sl_tls_err
classify(SSL *ssl, int sslerr)
{
	unsigned long e = ERR_peek_last_error();
	int reason = ERR_GET_REASON(e);
	enum sl_tls_err why;

	ERR_clear_error();
	if (!sni_ok(ssl))
		return SL_TLS_E_SNI;
	if (sslerr == SSL_ERROR_ZERO_RETURN ||
	    (sslerr == SSL_ERROR_SYSCALL && e == 0))
		return SL_TLS_E_EOF;
	switch (reason) {
	case SSL_R_HTTP_REQUEST:
	case SSL_R_HTTPS_PROXY_REQUEST:
		why = SL_TLS_E_HTTP;
		break;
	case SSL_R_UNSUPPORTED_PROTOCOL:
	case SSL_R_WRONG_VERSION_NUMBER:
	case SSL_R_VERSION_TOO_LOW:
		why = SL_TLS_E_VERSION;
		break;
	case SSL_R_NO_SHARED_CIPHER:
		why = SL_TLS_E_CIPHER;
		break;
	case SSL_R_NO_APPLICATION_PROTOCOL:
		why = SL_TLS_E_ALPN;
		break;
	case SSL_R_UNEXPECTED_EOF_WHILE_READING:   /* OpenSSL 3's EOF */
		why = SL_TLS_E_EOF;
		break;
	default:
		/* Alerts the peer sent: SSL_AD_REASON_OFFSET + the alert. */
		why = reason >= SSL_AD_REASON_OFFSET &&
		    reason < SSL_AD_REASON_OFFSET + 256 ? SL_TLS_E_ALERT :
		    SL_TLS_E_OTHER;
		if (reason == SSL_AD_REASON_OFFSET + SSL_AD_PROTOCOL_VERSION)
			why = SL_TLS_E_VERSION;
		break;
	}
	return why;
}

int
sl_tls_handshake(void *p, enum sl_tls_err *why)
{
	SSL *ssl = p;
	int r, e;

	ERR_clear_error();
	r = SSL_do_handshake(ssl);
	if (r == 1)
		return 1;
	e = SSL_get_error(ssl, r);
	if (e == SSL_ERROR_WANT_READ)
		return SL_TLS_WANT_READ;
	if (e == SSL_ERROR_WANT_WRITE)
		return SL_TLS_WANT_WRITE;
	*why = classify(ssl, e);
	return SL_TLS_ERROR;
}

enum sl_alpn
sl_tls_alpn(void *ssl)
{
	const unsigned char *p;
	unsigned int n;

	SSL_get0_alpn_selected(ssl, &p, &n);
	if (n == 2 && memcmp(p, "h2", 2) == 0)
		return SL_ALPN_H2;
	if (n == 8 && memcmp(p, "http/1.1", 8) == 0)
		return SL_ALPN_HTTP11;
	return SL_ALPN_NONE;
}

/* SSL_read/SSL_write's failure as one of ours. */
static ssize_t
io_result(SSL *ssl, int r)
{
	int e = SSL_get_error(ssl, r);

	switch (e) {
	case SSL_ERROR_WANT_READ:
		return SL_TLS_WANT_READ;
	case SSL_ERROR_WANT_WRITE:
		return SL_TLS_WANT_WRITE;
	case SSL_ERROR_ZERO_RETURN:
		return SL_TLS_CLOSED;
	case SSL_ERROR_SYSCALL:
		/* EOF without close_notify, or a reset: the peer is gone. */
		ERR_clear_error();
		return SL_TLS_CLOSED;
	default:
		ERR_clear_error();
		return SL_TLS_ERROR;
	}
}

ssize_t
sl_tls_read(void *p, void *buf, size_t len)
{
	SSL *ssl = p;
	size_t got = 0;
	int r;

	ERR_clear_error();
	r = SSL_read_ex(ssl, buf, len, &got);
	if (r == 1)
		return (ssize_t)got;
	return io_result(ssl, r);
}

int
sl_tls_pending(void *ssl)
{
	return SSL_pending(ssl) > 0;
}

ssize_t
sl_tls_writev(void *p, const struct iovec *iov, int cnt)
{
	static char scratch[16384];
	SSL *ssl = p;
	const void *src;
	size_t len, written = 0;
	int r, i;

	if (cnt <= 0)
		return 0;
	if (cnt == 1 || iov[0].iov_len >= sizeof(scratch)) {
		src = iov[0].iov_base;
		len = iov[0].iov_len;
	} else {
		for (len = 0, i = 0; i < cnt && len < sizeof(scratch); i++) {
			size_t k = iov[i].iov_len;

			if (k > sizeof(scratch) - len)
				k = sizeof(scratch) - len;
			memcpy(scratch + len, iov[i].iov_base, k);
			len += k;
		}
		src = scratch;
	}
	ERR_clear_error();
	r = SSL_write_ex(ssl, src, len, &written);
	if (r == 1)
		return (ssize_t)written;
	return io_result(ssl, r);
}

void
sl_tls_close_notify(void *ssl)
{
	ERR_clear_error();
	(void)SSL_shutdown(ssl);
	ERR_clear_error();
}
