-- Nothing to do on SQLite: it never checks foreign keys here (infra.sqlite leaves the pragma off).
SELECT 1;
