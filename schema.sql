-- placeholder; replaced by the store
-- migrate:1
CREATE TABLE IF NOT EXISTS vault_meta (name TEXT PRIMARY KEY, value BLOB NOT NULL);
