DROP TABLE IF EXISTS xr;
CREATE TABLE xr (id text PRIMARY KEY, job_id text, state text, priority int, run_at timestamptz, seq bigserial,
  lease_expires_at timestamptz, lease_token bigint, payload jsonb) WITH (autovacuum_vacuum_scale_factor=0, autovacuum_vacuum_threshold=1000, autovacuum_vacuum_cost_delay=0);
CREATE INDEX xr_due ON xr (job_id, priority, run_at, seq) WHERE state = 'waiting';
CREATE INDEX xr_lease ON xr (job_id, lease_expires_at) WHERE state = 'running';
CREATE OR REPLACE FUNCTION xr_round(n int, k int) RETURNS TABLE(upd_hit bigint, upd_total bigint) LANGUAGE plpgsql AS $$
DECLARE j json; ids text[];
BEGIN
  INSERT INTO xr (id, job_id, state, priority, run_at, payload)
    SELECT 'r' || lpad((k*n+g)::text, 10, '0'), 'j', 'waiting', 0, now(), '{}' FROM generate_series(1, n) g;
  SELECT array_agg(id) INTO ids FROM (SELECT id FROM xr WHERE job_id='j' AND state='waiting' ORDER BY priority, run_at, seq LIMIT n) s;
  EXECUTE 'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) UPDATE xr SET state=''running'', lease_expires_at=now()+interval ''30 s'', lease_token=1 WHERE id = ANY($1)' INTO j USING ids;
  DELETE FROM xr WHERE id = ANY(ids);
  upd_hit := (j->0->'Plan'->>'Shared Hit Blocks')::bigint + (j->0->'Plan'->>'Shared Read Blocks')::bigint;
  upd_total := n; RETURN NEXT;
END $$;
