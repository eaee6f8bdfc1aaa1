#include <sqlite3.h>
/* SQLITE_TRANSIENT is a cast macro that Swift does not import. */
static inline sqlite3_destructor_type csqlite_transient(void) { return SQLITE_TRANSIENT; }
/* sqlite3_config is variadic, which Swift cannot call. Memory statistics off: with them on,
 * every SQLite allocation in the process takes one global mutex, which the broker's writer and
 * readers then contend for (futex calls on each bind, step and reset). Keyhold reads none of
 * them (no soft heap limit). Must run before SQLite initialises; returns SQLITE_MISUSE after. */
static inline int csqlite_memstatus_off(void) { return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0); }

/* A version of one table's rows as one connection changes them (Database.watchRows): made odd
 * by the first change of a row of that table (the update hook, which runs before the change can
 * commit) and even again by csqlite_rows_settled, which the connection's owner calls whenever the
 * connection is outside a transaction. So it is never even while such a change is uncommitted,
 * and every change that commits moves it; a commit of another connection moves it by the time
 * the watching connection's next write transaction has begun (csqlite_rows_changed_elsewhere).
 * Other threads read it with csqlite_rows_version. The hook is not called for rows removed by the
 * truncate optimisation or by REPLACE: the watched table must be changed by plain INSERT, UPDATE
 * and DELETE … WHERE only. */
#include <stdint.h>
#include <string.h>
typedef struct csqlite_row_watch {
    uint64_t version;
    char table[64];
} csqlite_row_watch;

static void csqlite_row_watch_hook(void *context, int op, const char *db, const char *table, sqlite3_int64 rowid) {
    (void)op; (void)rowid;
    csqlite_row_watch *watch = context;
    if (strcmp(db, "main") != 0 || strcmp(table, watch->table) != 0) return;
    uint64_t now = __atomic_load_n(&watch->version, __ATOMIC_RELAXED);
    if ((now & 1) == 0) __atomic_store_n(&watch->version, now + 1, __ATOMIC_SEQ_CST);
}

static inline void csqlite_watch_rows(sqlite3 *db, csqlite_row_watch *watch) {
    sqlite3_update_hook(db, csqlite_row_watch_hook, watch);
}

static inline void csqlite_rows_settled(csqlite_row_watch *watch) {
    uint64_t now = __atomic_load_n(&watch->version, __ATOMIC_RELAXED);
    if (now & 1) __atomic_store_n(&watch->version, now + 1, __ATOMIC_SEQ_CST);
}

/* Moves the version by two (its parity kept): for a change the hook cannot see, one another
 * connection committed (Database notices it by PRAGMA data_version at each write transaction). */
static inline void csqlite_rows_changed_elsewhere(csqlite_row_watch *watch) {
    uint64_t now = __atomic_load_n(&watch->version, __ATOMIC_RELAXED);
    __atomic_store_n(&watch->version, now + 2, __ATOMIC_SEQ_CST);
}

static inline uint64_t csqlite_rows_version(const csqlite_row_watch *watch) {
    return __atomic_load_n(&watch->version, __ATOMIC_SEQ_CST);
}
