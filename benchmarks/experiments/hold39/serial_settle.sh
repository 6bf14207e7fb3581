P="psql -h 127.0.0.1 -p 5562 -U postgres -At"
for i in 1 2 3; do for t in main:TREE_MAIN br:TREE_WITH_PATCH; do n=${t%%:*}; d=${t#*:}
$P -c "SELECT pg_stat_statements_reset()" >/dev/null
PYTHONPATH=$d/src:$d timeout 300 /work/main/.venv/bin/python benchmarks/experiments/hold39/serial_settle.py.txt $n 40 >/dev/null 2>&1
echo "$i $n $(cut -d' ' -f1 /proc/loadavg) $($P -F' ' -c "SELECT sum(calls), sum(rows), round((1000*sum(total_exec_time)/sum(rows))::numeric,2), round(sum(shared_blks_hit+shared_blks_read)::numeric/sum(rows),2), round((1000*sum(total_exec_time) filter (where query like '%walk (priority%')/nullif(sum(rows) filter (where query like '%walk (priority%'),0))::numeric,2) FROM pg_stat_statements WHERE query LIKE '%WITH settle AS%' OR query LIKE '%walk (priority%' GROUP BY query LIKE '%WITH settle AS%' ORDER BY 1")"
done; done
