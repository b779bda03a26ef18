-- The identity of this database. Redis outlives databases: a developer
-- drops and recreates Postgres but keeps Redis, two deployments share one
-- Redis, a database is restored next to the old one. Every key the service
-- writes in Redis (sold-out flags, order-id counters, locks) lives under
-- this namespace, made here once when the database is migrated, so that
-- Redis state written for another database can never speak for this one:
-- a new database starts with an empty namespace, whatever Redis holds.
CREATE TABLE deployment (
    -- One row only.
    singleton  BOOLEAN     PRIMARY KEY DEFAULT true CHECK (singleton),
    namespace  UUID        NOT NULL DEFAULT gen_random_uuid(),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO deployment DEFAULT VALUES;
