-- Text in byte order: every text column of the schema takes the `C` collation, as SQLite
-- compares text. The ids, namespaces and queue names that lead the indexes of `jobs`, `tasks`
-- and `events` compared through the operating system's locale under any other collation
-- (`C.UTF-8` included), 5-8% of PostgreSQL's CPU a drained job (BENCHMARKS.md); text now
-- also sorts as on SQLite. Every column changes, not only the indexed ones: PostgreSQL refuses
-- to compare two texts of different implicit collations (a join of `tasks.job_id` with
-- `jobs.id`, say). The rows stay as they are; each index on such a column is built again. A
-- column added later must say `COLLATE "C"` (a test checks).
DO $$
DECLARE
    altered record;
BEGIN
    FOR altered IN
        SELECT c.relname AS table_name,
               string_agg(format('ALTER COLUMN %I TYPE text COLLATE "C"', a.attname), ', '
                          ORDER BY a.attnum) AS changes
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        WHERE c.relnamespace = current_schema()::regnamespace
          AND c.relkind IN ('r', 'p')
          AND NOT c.relispartition
          AND a.attnum > 0
          AND NOT a.attisdropped
          AND a.atttypid = 'text'::regtype
          AND a.attcollation <> 'pg_catalog."C"'::regcollation
        GROUP BY c.relname
        ORDER BY c.relname
    LOOP
        EXECUTE format('ALTER TABLE %I %s', altered.table_name, altered.changes);
    END LOOP;
END
$$;
