-- A claim's starving pass (ready tasks older than their queue's `max_wait`, oldest first) reads
-- `tasks_dispatch` once per priority level of the queue instead of an index in age order, which
-- every task paid for with an entry written when it became ready and removed when claimed.
DROP INDEX tasks_age;
