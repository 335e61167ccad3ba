-- A worker's claim writes no history event: the task row keeps when the claim it holds now
-- began (NULL once that run ended), and the event that ends the run carries it in its detail
-- (`claimed_at`). Histories written before keep their `task_claimed` events.
ALTER TABLE tasks ADD COLUMN claimed_at INTEGER;
