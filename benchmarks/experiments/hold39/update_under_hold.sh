P="psql -h 127.0.0.1 -p 5562 -U postgres -d t39 -At"
for k in $(seq 1 40); do $P -c "SELECT upd_hit::numeric/upd_total FROM xr_round(300, $k)"; done | awk '{s+=$1; n++} END {print "pre-hold mean buffers/run", s/n}'
$P -c "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class; SELECT pg_sleep(120); COMMIT" >/dev/null &
HP=$!
sleep 1
for k in $(seq 41 200); do $P -c "SELECT upd_hit::numeric/upd_total FROM xr_round(300, $k)"; done | awk '{s+=$1; n++; if (n%40==0) {print "held, rounds", n-39, "-", n, "mean", s/40; s=0}}'
kill $HP
