#ifndef CKEYHOLDSS_H
#define CKEYHOLDSS_H
#include <stddef.h>
#include <stdint.h>

/* Secret Service session crypto (dh-ietf1024-sha256-aes128-cbc-pkcs7) on OpenSSL's libcrypto.
 * Only the agent links this; the broker never does. All functions return 0 on success. */

#define CKSS_DH_BYTES 128
#define CKSS_AES_KEY_BYTES 16
#define CKSS_IV_BYTES 16

/* Makes a key pair in the RFC 2409 1024-bit MODP group (generator 2): private key in
 * `priv` (CKSS_DH_BYTES), public key big-endian, zero-padded, in `pub` (CKSS_DH_BYTES). */
int ckss_dh_keypair(uint8_t *priv, uint8_t *pub);

/* Derives the AES-128 key from our private key and the peer's public key (big-endian, any
 * length up to CKSS_DH_BYTES): HKDF-SHA256 of the zero-padded shared secret, no salt, no info.
 * Refuses a peer key outside 2..p-2. */
int ckss_dh_derive(const uint8_t *priv, const uint8_t *peer, size_t peer_len, uint8_t *aes_key);

/* AES-128-CBC with PKCS#7. `out` needs in_len + 16 bytes; *out_len is set. */
int ckss_aes_encrypt(const uint8_t *key, const uint8_t *iv, const uint8_t *in, size_t in_len,
                     uint8_t *out, size_t *out_len);
int ckss_aes_decrypt(const uint8_t *key, const uint8_t *iv, const uint8_t *in, size_t in_len,
                     uint8_t *out, size_t *out_len);

/* Random bytes from the kernel. */
int ckss_random(uint8_t *out, size_t len);

/* SIGTERM/SIGINT set a flag the event loop checks (an async-signal-safe handler). */
void ckss_install_termination_handler(void);
int ckss_terminated(void);

/* A non-blocking, close-on-exec eventfd: prompt threads wake the event loop with it. */
int ckss_eventfd(void);

/* Wipes memory the compiler may not elide. */
void ckss_wipe(void *p, size_t len);

#endif
