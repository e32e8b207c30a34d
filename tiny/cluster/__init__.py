"""Cluster mode's commit point: each flush one PostgreSQL transaction, replicated synchronously, in one global order.

The modules, each with its contract in its docstring:

- tiny.cluster.log: :class:`~tiny.cluster.log.CommitLog`, what the sink and a follower call
  (open, commit, read, head, report, retain);
- tiny.cluster.schema: the tables, created once, checked by every host;
- tiny.cluster.session: a connection to the primary with bounded waits that never cancel;
- tiny.cluster.replication: whether the synchronous standbys have a WAL position;
- tiny.cluster.resolve: settling a COMMIT whose answer was lost, by the flush's id;
- tiny.cluster.retention: what the log keeps, deleted in bounded steps;
- tiny.cluster.errors: what they raise, each saying whether anything may have been kept.

It expects a PostgreSQL cluster run by Patroni in strict synchronous mode (three nodes, one
synchronous standby, ``synchronous_commit = on``), and refuses one that would acknowledge a
commit before a standby has it. Two traps of that stack shape it (measured on this machine
kind): a COMMIT whose wait for the standby is cancelled (a query cancel, a backend
terminated) returns success with only a WARNING while its rows are on the primary alone, so no
wait is ever cancelled and such an answer is settled, not trusted; and Debian's Patroni 3.0.2
must use etcd's v2 API (its ``etcd:`` section), under which a frozen primary is demoted
cleanly, where ``etcd3:`` once let two nodes be primary.

Imported only in cluster mode: it needs psycopg (3), which the embedded default never loads.
"""
