DROP INDEX IF EXISTS executions_turn_step;
