#include "ckeyholdss.h"
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>

static int to_padded(const BIGNUM *n, uint8_t *out) {
    return BN_bn2binpad(n, out, CKSS_DH_BYTES) == CKSS_DH_BYTES ? 0 : -1;
}

int ckss_dh_keypair(uint8_t *priv, uint8_t *pub) {
    int rc = -1;
    BN_CTX *ctx = BN_CTX_new();
    BIGNUM *p = BN_get_rfc2409_prime_1024(NULL), *g = BN_new(), *x = BN_secure_new(), *y = BN_new();
    if (!ctx || !p || !g || !x || !y || !BN_set_word(g, 2)) goto done;
    /* A private exponent in [2, p-2]. */
    do {
        if (!BN_priv_rand_range(x, p)) goto done;
    } while (BN_cmp(x, BN_value_one()) <= 0);
    if (!BN_mod_exp(y, g, x, p, ctx)) goto done;
    if (to_padded(x, priv) || to_padded(y, pub)) goto done;
    rc = 0;
done:
    BN_CTX_free(ctx); BN_free(p); BN_free(g); BN_clear_free(x); BN_free(y);
    return rc;
}

int ckss_dh_derive(const uint8_t *priv, const uint8_t *peer, size_t peer_len, uint8_t *aes_key) {
    int rc = -1;
    uint8_t shared[CKSS_DH_BYTES], prk[32], okm[32];
    unsigned int len = 0;
    const uint8_t salt[32] = {0}, one = 1;
    BN_CTX *ctx = BN_CTX_new();
    BIGNUM *p = BN_get_rfc2409_prime_1024(NULL), *x = BN_secure_new(), *y = BN_new(), *s = BN_secure_new(), *pm1 = BN_new();
    if (peer_len == 0 || peer_len > CKSS_DH_BYTES) goto done;
    if (!ctx || !p || !x || !y || !s || !pm1) goto done;
    if (!BN_bin2bn(priv, CKSS_DH_BYTES, x) || !BN_bin2bn(peer, (int)peer_len, y)) goto done;
    if (!BN_copy(pm1, p) || !BN_sub_word(pm1, 1)) goto done;
    /* 1 and p-1 (and anything outside the group) would force the shared secret. */
    if (BN_cmp(y, BN_value_one()) <= 0 || BN_cmp(y, pm1) >= 0) goto done;
    if (!BN_mod_exp(s, y, x, p, ctx) || to_padded(s, shared)) goto done;
    /* HKDF-SHA256 (RFC 5869), salt of zeros, empty info, one block is enough for 16 bytes. */
    if (!HMAC(EVP_sha256(), salt, sizeof salt, shared, sizeof shared, prk, &len) || len != 32) goto done;
    if (!HMAC(EVP_sha256(), prk, sizeof prk, &one, 1, okm, &len) || len != 32) goto done;
    memcpy(aes_key, okm, CKSS_AES_KEY_BYTES);
    rc = 0;
done:
    OPENSSL_cleanse(shared, sizeof shared); OPENSSL_cleanse(prk, sizeof prk); OPENSSL_cleanse(okm, sizeof okm);
    BN_CTX_free(ctx); BN_free(p); BN_clear_free(x); BN_free(y); BN_clear_free(s); BN_free(pm1);
    return rc;
}

static int aes(int enc, const uint8_t *key, const uint8_t *iv, const uint8_t *in, size_t in_len,
               uint8_t *out, size_t *out_len) {
    int rc = -1, n1 = 0, n2 = 0;
    if (in_len > 0x7fffff00) return -1;
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    if (!c) return -1;
    if (EVP_CipherInit_ex(c, EVP_aes_128_cbc(), NULL, key, iv, enc) != 1) goto done;
    if (EVP_CipherUpdate(c, out, &n1, in, (int)in_len) != 1) goto done;
    if (EVP_CipherFinal_ex(c, out + n1, &n2) != 1) goto done;
    *out_len = (size_t)n1 + (size_t)n2;
    rc = 0;
done:
    EVP_CIPHER_CTX_free(c);
    return rc;
}

int ckss_aes_encrypt(const uint8_t *key, const uint8_t *iv, const uint8_t *in, size_t in_len, uint8_t *out, size_t *out_len) {
    return aes(1, key, iv, in, in_len, out, out_len);
}

int ckss_aes_decrypt(const uint8_t *key, const uint8_t *iv, const uint8_t *in, size_t in_len, uint8_t *out, size_t *out_len) {
    if (in_len == 0 || in_len % 16 != 0) return -1;
    return aes(0, key, iv, in, in_len, out, out_len);
}

int ckss_random(uint8_t *out, size_t len) {
    return RAND_bytes(out, (int)len) == 1 ? 0 : -1;
}

static volatile sig_atomic_t terminated = 0;
static void on_term(int sig) { (void)sig; terminated = 1; }

void ckss_install_termination_handler(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* A parent may have left them blocked (the mask is inherited across exec). */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
}

int ckss_terminated(void) { return terminated; }

int ckss_eventfd(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

void ckss_wipe(void *p, size_t len) { OPENSSL_cleanse(p, len); }
