// E1-E3 from a second language (SPEC §18): node-postgres calls <runs>_enqueue_v1.
// 1,000 enqueues, every tenth repeating an earlier dedupe key, each carrying Node's W3C trace
// context; prints one JSON line: the outcomes and each call's commit time (ms since epoch).
const { Client } = require("pg");

async function main() {
  const client = new Client({ connectionString: process.env.SHIP_DSN });
  await client.connect();
  const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  const outcomes = { inserted: 0, deduplicated: 0, "queue-full": 0 };
  const committed = [];
  for (let i = 0; i < 1000; i++) {
    const key = i % 10 === 9 ? `node-${i - 9}` : `node-${i}`;
    const { rows } = await client.query(
      "SELECT run_id, outcome FROM ship_job_runs_enqueue_v1($1, $2::jsonb," +
        " dedupe_key => $3, trace_context => $4::jsonb)",
      ["sql.plain", JSON.stringify({ n: i }), key, JSON.stringify({ traceparent })],
    );
    outcomes[rows[0].outcome] += 1;
    committed.push(Date.now());
  }
  const bulk = await client.query(
    "SELECT outcome FROM ship_job_runs_enqueue_many_v1($1::jsonb)",
    [JSON.stringify([{ job_id: "sql.plain", payload: { n: 0 }, dedupe_key: "node-0" }])],
  );
  await client.end();
  console.log(JSON.stringify({ outcomes, bulk: bulk.rows.map((r) => r.outcome), traceparent,
    committed }));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
