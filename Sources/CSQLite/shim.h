#include <sqlite3.h>
/* SQLITE_TRANSIENT is a cast macro that Swift does not import. */
static inline sqlite3_destructor_type csqlite_transient(void) { return SQLITE_TRANSIENT; }
/* sqlite3_config is variadic, which Swift cannot call. Memory statistics off: with them on,
 * every SQLite allocation in the process takes one global mutex, which the broker's writer and
 * readers then contend for (futex calls on each bind, step and reset). Keyhold reads none of
 * them (no soft heap limit). Must run before SQLite initialises; returns SQLITE_MISUSE after. */
static inline int csqlite_memstatus_off(void) { return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0); }
