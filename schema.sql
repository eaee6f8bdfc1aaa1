-- Keyhold vault database: the single definition of its tables.
--
-- The store applies every block whose number is above the database's PRAGMA user_version,
-- each in its own transaction together with `PRAGMA user_version = N`. Blocks are never
-- edited once released: a change is a new `-- migrate:N` block.
--
-- Nothing here holds a name or a secret in plaintext: service, account and label are in
-- sealed boxes, lookups go through a keyed blind index, audit names are sealed too.

-- migrate:1

-- Marks a Keyhold database. `format` = 'keyhold-vault'; `key_check` = keyed BLAKE2b under a
-- subkey of the vault key, so a database opened with another key file is refused clearly.
CREATE TABLE vault_meta (
    name  TEXT PRIMARY KEY NOT NULL,
    value BLOB NOT NULL
) WITHOUT ROWID;
INSERT INTO vault_meta (name, value) VALUES ('format', 'keyhold-vault');

CREATE TABLE items (
    id                  BLOB PRIMARY KEY NOT NULL CHECK (length(id) = 16),  -- random, stable
    owner_uid           INTEGER NOT NULL,
    lookup              BLOB NOT NULL UNIQUE,   -- blind index of (owner, service, account)
    kind                INTEGER NOT NULL,
    policy              TEXT NOT NULL,          -- canonical policy expression
    allowed_executables BLOB NOT NULL,          -- canonical encoding of the path list
    reuse_seconds       INTEGER NOT NULL,
    biometry_state      BLOB,                   -- enrolled-set digest (biometry-current-set)
    pwhash_params       BLOB,                   -- Argon2id parameters (+app-password)
    attributes          BLOB NOT NULL,          -- sealed (service, account, label), attribute key
    wrapped_key         BLOB NOT NULL,          -- item key sealed under the wrapping key
    secret              BLOB NOT NULL,          -- secret sealed under the item key
    created_us          INTEGER NOT NULL,
    updated_us          INTEGER NOT NULL
);
-- Every column above the boxes is bound into each box's associated data.
CREATE INDEX items_owner ON items (owner_uid);

-- Consecutive authentication failures per caller uid; survives restarts.
CREATE TABLE lockout (
    uid             INTEGER PRIMARY KEY NOT NULL,
    failures        INTEGER NOT NULL,
    level           INTEGER NOT NULL,
    locked_until_us INTEGER NOT NULL
);

-- Append-only audit log. mac = BLAKE2b_auditKey(previous mac || canonical row incl. seq);
-- entry_tag = BLAKE2b_auditKey(canonical row without seq), so verification can tell a moved
-- row (reordered) from an edited or forged one.
CREATE TABLE audit (
    seq        INTEGER PRIMARY KEY NOT NULL,
    time_us    INTEGER NOT NULL,
    caller_uid INTEGER NOT NULL,
    caller_pid INTEGER NOT NULL,
    executable TEXT NOT NULL,
    operation  TEXT NOT NULL,
    item_id    BLOB,
    details    BLOB,            -- sealed (service, account, reason), attribute key
    decision   TEXT NOT NULL,
    method     TEXT NOT NULL,
    outcome    TEXT NOT NULL,
    entry_tag  BLOB NOT NULL,
    mac        BLOB NOT NULL
);
CREATE INDEX audit_time ON audit (time_us);

-- The newest entry (seq, mac) and head_tag = BLAKE2b_auditKey("head" || seq || mac): deleting
-- the newest rows is detected even when the rows that remain chain correctly.
CREATE TABLE audit_head (
    id       INTEGER PRIMARY KEY NOT NULL CHECK (id = 1),
    seq      INTEGER NOT NULL,
    mac      BLOB NOT NULL,
    head_tag BLOB NOT NULL
);

-- Where the chain starts when older entries were exported and pruned (seq of the last pruned
-- entry and its mac), tagged like the head. Absent until the first prune.
CREATE TABLE audit_checkpoint (
    id              INTEGER PRIMARY KEY NOT NULL CHECK (id = 1),
    seq             INTEGER NOT NULL,
    mac             BLOB NOT NULL,
    checkpoint_tag  BLOB NOT NULL
);

-- migrate:2

-- Item generations (issue 8, item 6): an older copy of an item's row must not open.
-- `generation` grows on every change of an item's secret or policy and is bound into the
-- associated data of its boxes (0 = written before this migration, sealed without it).
ALTER TABLE items ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;

-- Each existing item's current generation. A row of `items` whose generation differs, or
-- whose id is absent here (a deleted item put back), fails with integrity.
CREATE TABLE item_generation (
    item_id    BLOB PRIMARY KEY NOT NULL CHECK (length(item_id) = 16),
    generation INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO item_generation (item_id, generation) SELECT id, generation FROM items;

-- digest = XOR over item_generation of BLAKE2b_generationKey(item_id || generation), kept
-- up to date on every change; tag = BLAKE2b_generationKey("generation head" || digest ||
-- audit head seq || audit head mac), rewritten with every audit entry. Restoring older rows
-- of item_generation (and this row) no longer matches the audit head. Written by the store
-- on the first open after this migration (SQL cannot compute it).
CREATE TABLE item_generation_head (
    id     INTEGER PRIMARY KEY NOT NULL CHECK (id = 1),
    digest BLOB NOT NULL,
    tag    BLOB NOT NULL
);

-- migrate:3

-- Item expiry (issue 10, item 4): when the item's secret expires, µs since the epoch, or NULL.
-- Informational (an expired item is still released; `state` says `expired`), but bound into
-- the associated data of the item's boxes when set, so editing it on disk is integrity.
ALTER TABLE items ADD COLUMN expires_us INTEGER;

-- migrate:4

-- Search by any subset of an item's attributes (issue 11, item 3) without plaintext: one row
-- per attribute pair of the item's map (AttributeMap, from its sealed service and account),
-- tag = BLAKE2b_searchKey(owner_uid || len key || key || len value || value). Equal pairs of
-- one owner share a tag; nothing else is readable. An index only: the broker opens every
-- candidate and matches its sealed map exactly, so a forged, moved or deleted row can hide an
-- item from a search but never return one that does not match or is another user's. Written
-- with every put, update and delete; rows of items older than this migration are written by
-- the store on its first open after it (SQL cannot compute them), marked in vault_meta.
CREATE TABLE item_search (
    item_id BLOB NOT NULL REFERENCES items (id) ON DELETE CASCADE,
    tag     BLOB NOT NULL
);
CREATE INDEX item_search_tag ON item_search (tag);
CREATE INDEX item_search_item ON item_search (item_id, tag);

-- migrate:5

-- A user's own audit entries by index (issue 8, item 9 numbers them among their own): a
-- user's `keyhold audit`, its numbering, and `audit verify`'s count of their entries read
-- that user's rows only, instead of every entry in the log.
CREATE INDEX IF NOT EXISTS audit_uid ON audit (caller_uid, seq);

-- migrate:6

-- Rotation leases whose secret was released (issue 36 item 1): a row is written in the same
-- transaction as the release's audit entry and removed with the rotation's commit or cancel.
-- A rotation cut off (its connection ended, or the broker restarted) keeps its item leased
-- until `until_us` (wall clock, µs), while the COMMAND that received the old secret may still
-- run; a restarted broker reads this table and honours every unexpired row.
CREATE TABLE IF NOT EXISTS rotation_leases (
    item_id  BLOB PRIMARY KEY NOT NULL CHECK (length(item_id) = 16),
    until_us INTEGER NOT NULL
) WITHOUT ROWID;
