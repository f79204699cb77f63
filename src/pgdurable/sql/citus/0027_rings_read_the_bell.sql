-- The Citus layout, version 27 (recorded in schema_migrations as 10027): the single-node migration of this
-- number redefines ring_doorbells with a forced generic plan, which this layout does not use for it (see
-- sql/citus/0018: the doorbells are a plain coordinator table).
ALTER FUNCTION ring_doorbells(text[]) RESET plan_cache_mode;
