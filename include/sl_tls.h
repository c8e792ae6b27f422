/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_tls: the listener's TLS (OpenSSL 3), below the framing.
 *
 * A context is made once per configuration load (sluice -t, start, every
 * SIGHUP) from the `tls:` keys: certificate chain and key read and matched,
 * dates checked, versions, ALPN. Workers inherit it across fork; each
 * connection takes an SSL of the context it was accepted under, so a reload
 * changes the pair for new connections only (OpenSSL counts the context's
 * references: the old one goes with its last connection).
 *
 * The transport calls are non-blocking and free of the event loop: they say
 * what they wait for (SL_TLS_WANT_READ/WRITE) and the connection arms its
 * watchers accordingly.
 */
#ifndef SL_TLS_H
#define SL_TLS_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

/* ALPN protocol identifiers sluice offers, in tls.alpn order. */
enum sl_alpn { SL_ALPN_NONE = 0, SL_ALPN_H2, SL_ALPN_HTTP11 };

struct sl_tls_conf {
	int enabled;              /* a `tls:` block is present */
	char *cert;               /* PEM chain, leaf first */
	char *key;                /* PEM private key */
	char *min_version;        /* "TLSv1.2" (default) or "TLSv1.3" */
	int alpn[2];              /* enum sl_alpn, preference order; 0 ends */
	void *ctx;                /* SSL_CTX *, made by the loader when it
	                           * checks files; NULL otherwise */
	char *warning;            /* what the loader would warn of; NULL */
};

/* Why a handshake failed: the label of sluice_tls_handshake_errors_total. */
enum sl_tls_err {
	SL_TLS_E_HTTP,            /* plain HTTP sent to the TLS port */
	SL_TLS_E_VERSION,         /* a protocol version below min_version */
	SL_TLS_E_CIPHER,          /* no cipher suite in common */
	SL_TLS_E_ALPN,            /* no application protocol in common */
	SL_TLS_E_SNI,             /* a server name the certificate does not
	                           * cover */
	SL_TLS_E_ALERT,           /* the client aborted (e.g. it does not
	                           * trust the certificate) */
	SL_TLS_E_EOF,             /* the client closed mid-handshake */
	SL_TLS_E_TIMEOUT,         /* not done within timeouts.client_header */
	SL_TLS_E_OTHER,           /* any other malformed handshake */
	SL_TLS_E_MAX
};

const char *sl_tls_err_name(enum sl_tls_err);

/*
 * Make the context of conf: reads and checks the certificate and key (the
 * key matches the leaf, the leaf is valid now). Returns the SSL_CTX, or
 * NULL with a message in err. A leaf expiring within 14 days, or a key file
 * others can read, is not an error: warn says so (warn[0] == '\0': none).
 */
void *sl_tls_ctx_new(const struct sl_tls_conf *conf, char *err, size_t errlen,
    char *warn, size_t warnlen);
void sl_tls_ctx_free(void *ctx);

/* Results of the transport calls. */
#define SL_TLS_WANT_READ  (-2)
#define SL_TLS_WANT_WRITE (-3)
#define SL_TLS_CLOSED     (-4)    /* the peer closed (EOF or close_notify) */
#define SL_TLS_ERROR      (-1)

/* An SSL for an accepted socket (server side), or NULL. */
void *sl_tls_new(void *ctx, int fd);
void sl_tls_free(void *ssl);

/*
 * Drive the handshake: 1 done, SL_TLS_WANT_*, or SL_TLS_ERROR with *why
 * set. The OpenSSL error queue is left empty.
 */
int sl_tls_handshake(void *ssl, enum sl_tls_err *why);
/* The protocol ALPN chose (after the handshake). */
enum sl_alpn sl_tls_alpn(void *ssl);

/* Plaintext read: bytes (> 0), SL_TLS_CLOSED, SL_TLS_WANT_* or ERROR. */
ssize_t sl_tls_read(void *ssl, void *buf, size_t len);
/* Plaintext bytes OpenSSL holds already (the socket will not wake us). */
int sl_tls_pending(void *ssl);
/*
 * Write iov[0..cnt): a first piece of 16 KiB or more goes as it is; shorter
 * pieces are copied together (up to 16 KiB, one record, one syscall)
 * through a buffer of the process. Returns the bytes taken (> 0),
 * SL_TLS_WANT_*, or SL_TLS_ERROR. After a WANT the caller calls again with
 * the same leading bytes, or more of them (it keeps them until they are
 * taken, as every flush does).
 */
ssize_t sl_tls_writev(void *ssl, const struct iovec *iov, int cnt);
/* Send close_notify if the socket takes it now; never waits. */
void sl_tls_close_notify(void *ssl);

#endif
