import Glibc

/// The floor `keyhold get` is compared with: a minimal C program the benchmark compiles
/// itself that does the same work without a broker — initialise libsodium, read a key, derive
/// the index and sealing subkeys, look the item up by blind index in SQLite, open an
/// XChaCha20-Poly1305 box and write the secret to stdout. What keyhold adds on top (a Swift
/// runtime, a socket round trip, policy, the audit entry) is the ratio the benchmark prints.
enum Floor {
    static let source = #"""
    #include <sodium.h>
    #include <sqlite3.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include <unistd.h>

    static void subkeys(const unsigned char *master, unsigned char idx[32], unsigned char seal[32]) {
        crypto_kdf_derive_from_key(idx, 32, 1, "floorkey", master);
        crypto_kdf_derive_from_key(seal, 32, 2, "floorkey", master);
    }
    static void blind(const unsigned char *key, const char *s, const char *a, unsigned char out[32]) {
        crypto_generichash_state st;
        crypto_generichash_init(&st, key, 32, 32);
        crypto_generichash_update(&st, (const unsigned char *)s, strlen(s) + 1);
        crypto_generichash_update(&st, (const unsigned char *)a, strlen(a) + 1);
        crypto_generichash_final(&st, out, 32);
    }
    int main(int argc, char **argv) {
        if (sodium_init() < 0) return 1;
        unsigned char master[32], idx[32], seal[32], b[32];
        sqlite3 *db; sqlite3_stmt *st;
        if (argc == 5 && !strcmp(argv[1], "init")) {   /* floor init DB KEYFILE N */
            randombytes_buf(master, 32);
            FILE *k = fopen(argv[3], "wb"); if (!k || fwrite(master, 1, 32, k) != 32) return 2; fclose(k);
            subkeys(master, idx, seal);
            if (sqlite3_open(argv[2], &db) != SQLITE_OK) return 3;
            sqlite3_exec(db, "PRAGMA journal_mode=WAL; CREATE TABLE items(blind BLOB PRIMARY KEY, nonce BLOB, box BLOB) WITHOUT ROWID; BEGIN", 0, 0, 0);
            sqlite3_prepare_v2(db, "INSERT INTO items VALUES (?1, ?2, ?3)", -1, &st, 0);
            unsigned char value[64], nonce[24], box[64 + 16]; unsigned long long blen; char account[32];
            memset(value, 't', sizeof value);
            for (long i = 0; i < atol(argv[4]); i++) {
                snprintf(account, sizeof account, "user-%ld", i);
                blind(idx, "bench.example", account, b);
                randombytes_buf(nonce, sizeof nonce);
                crypto_aead_xchacha20poly1305_ietf_encrypt(box, &blen, value, sizeof value, b, 32, NULL, nonce, seal);
                sqlite3_bind_blob(st, 1, b, 32, SQLITE_STATIC);
                sqlite3_bind_blob(st, 2, nonce, 24, SQLITE_STATIC);
                sqlite3_bind_blob(st, 3, box, (int)blen, SQLITE_STATIC);
                if (sqlite3_step(st) != SQLITE_DONE) return 4;
                sqlite3_reset(st);
            }
            sqlite3_finalize(st);
            sqlite3_exec(db, "COMMIT", 0, 0, 0);
            return sqlite3_close(db) == SQLITE_OK ? 0 : 5;
        }
        if (argc == 6 && !strcmp(argv[1], "get")) {     /* floor get DB KEYFILE SERVICE ACCOUNT */
            FILE *k = fopen(argv[3], "rb"); if (!k || fread(master, 1, 32, k) != 32) return 2; fclose(k);
            subkeys(master, idx, seal);
            sodium_memzero(master, 32);
            blind(idx, argv[4], argv[5], b);
            if (sqlite3_open_v2(argv[2], &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) return 3;
            if (sqlite3_prepare_v2(db, "SELECT nonce, box FROM items WHERE blind = ?1", -1, &st, 0) != SQLITE_OK) return 3;
            sqlite3_bind_blob(st, 1, b, 32, SQLITE_STATIC);
            if (sqlite3_step(st) != SQLITE_ROW || sqlite3_column_bytes(st, 0) != 24) return 4;
            int blen = sqlite3_column_bytes(st, 1);
            if (blen < 16) return 4;
            unsigned char *plain = sodium_malloc(blen - 16); unsigned long long plen;
            if (crypto_aead_xchacha20poly1305_ietf_decrypt(plain, &plen, NULL, sqlite3_column_blob(st, 1), blen, b, 32,
                                                           sqlite3_column_blob(st, 0), seal) != 0) return 5;
            if (write(1, plain, plen) != (ssize_t)plen) return 6;
            sodium_free(plain);
            sqlite3_finalize(st);
            sqlite3_close(db);
            return 0;
        }
        return 64;
    }
    """#

    /// Compiles the floor in `dir` and fills its database with `items` rows; returns the
    /// program's path, or nil (with the reason printed) when no C compiler is installed.
    static func build(in dir: String, items: Int) -> String? {
        guard let cc = installed("cc") else { print("floor: no C compiler (cc); floor rows skipped"); return nil }
        let src = dir + "/floor.c", exe = dir + "/floor"
        guard let f = fopen(src, "w") else { return nil }
        fputs(source, f)
        fclose(f)
        guard run(cc, ["-O2", "-o", exe, src, "-lsodium", "-lsqlite3"]) == 0,
              run(exe, ["init", dir + "/floor.db", dir + "/floor.key", String(items)]) == 0 else {
            print("floor: building the C floor failed; floor rows skipped")
            return nil
        }
        return exe
    }

    static func getArguments(in dir: String, account: String) -> [String] {
        ["get", dir + "/floor.db", dir + "/floor.key", "bench.example", account]
    }
}
