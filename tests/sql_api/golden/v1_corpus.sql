-- E5: the frozen corpus of v1 calls (SPEC §18). Every later schema must give this exact output
-- after `schema apply` / install_sql_enqueue. Never edit a call here; add new ones below.
\set ON_ERROR_STOP off
\set SHOW_CONTEXT never
\pset null '(null)'
-- E1: inserted, deduplicated (by dedupe key, by durable id), queue-full (J1, J2)
SELECT * FROM ship_job_runs_enqueue_v1('sql.plain', '{"a": 1}', run_id => 'g-1', dedupe_key => 'k1');
SELECT * FROM ship_job_runs_enqueue_v1('sql.plain', '{"a": 2}', dedupe_key => 'k1');
SELECT * FROM ship_job_runs_enqueue_v1('sql.plain', '{}', run_id => 'g-1');
SELECT * FROM ship_job_runs_enqueue_v1('sql.capped', '{}', run_id => 'c-1');
SELECT * FROM ship_job_runs_enqueue_v1('sql.capped', '{}', run_id => 'c-2');
SELECT * FROM ship_job_runs_enqueue_v1('sql.capped', '{}', run_id => 'c-3');
SELECT * FROM ship_job_runs_enqueue_v1('sql.capped', '{}', run_id => 'c-4');
-- every positional argument (E1's signature)
SELECT * FROM ship_job_runs_enqueue_v1('sql.plain', '{"p": true}', '2030-01-01T00:00:00Z', 5,
    'k2', 'g-2', 'acme', NULL,
    '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}', '{}');
SELECT id, job_id, state, payload, dedupe_key, max_attempts, run_at, priority, trace_context,
    tenant_id FROM ship_job_runs WHERE id = 'g-2';
-- the bulk form
SELECT * FROM ship_job_runs_enqueue_many_v1('[
    {"job_id": "sql.plain", "payload": {"b": 1}, "run_id": "b-1"},
    {"job_id": "sql.plain", "payload": {"b": 2}, "dedupe_key": "k1"},
    {"job_id": "sql.capped", "payload": {}}]');
-- E4: every error code
SELECT * FROM ship_job_runs_enqueue_v1('no.such.job', '{}');
SELECT * FROM ship_job_runs_enqueue_v1('sql.plain', '{}', options => '{"colour": "red"}');
SELECT * FROM ship_job_runs_enqueue_v1('sql.plain', '{}', options => '{"partition_key": "p"}');
SELECT * FROM ship_job_runs_enqueue_v1('sql.plain', '{}', priority => 11);
SELECT * FROM ship_job_runs_enqueue_v1('sql.plain', '{}', dedupe_key => '');
SELECT * FROM ship_job_runs_enqueue_v1('sql.plain', NULL);
SELECT * FROM ship_job_runs_enqueue_v1('sql.small', '{"text": "ééééé"}');
SELECT * FROM ship_job_runs_enqueue_v1('sql.plain', '{}', trace_context => '{"traceparent": 1}');
SELECT * FROM ship_job_runs_enqueue_many_v1('{"not": "an array"}');
SELECT * FROM ship_job_runs_enqueue_many_v1('[{"job_id": "sql.plain", "colour": "red"}]');
-- E5: a user's wrapper function over v1 (what blocked graphile-worker's upgrades)
CREATE FUNCTION app_enqueue_order(order_id integer) RETURNS text LANGUAGE sql AS $$
    SELECT outcome FROM ship_job_runs_enqueue_v1('sql.plain',
        jsonb_build_object('order', order_id), dedupe_key => 'order-' || order_id)
$$;
SELECT app_enqueue_order(1), app_enqueue_order(1);
SELECT version, function_name FROM ship_job_runs_enqueue_versions() ORDER BY function_name;
