-- Stress run set-up: the extension, the call log and its helper.  Activities
-- are created per round by round.sql.
CREATE EXTENSION redpacket;

-- The activities under test; check.sql walks this table.
CREATE TABLE stress_activity (
    id    bigint PRIMARY KEY,
    round integer NOT NULL,
    kind  text NOT NULL,           -- fixed, lucky, rain, cent7
    label text NOT NULL UNIQUE,    -- round/kind, for people
    descr text NOT NULL
);

-- One row per rp_claim call, written in the claim's own transaction (for the
-- rolled-back callers: right after their rollback).
CREATE TABLE stress_log (
    id           bigserial PRIMARY KEY,
    activity_id  bigint NOT NULL,
    user_id      text NOT NULL,
    request_id   text,
    req_amount   numeric,                -- NULL: lucky draw
    status       redpacket.claim_status,
    claim_id     bigint,
    amount       numeric,
    claimed_at   timestamptz,
    seen_balance numeric,                -- sum of stripe balances right after the claim (minor units)
    seen_packets numeric,                -- sum of stripe packet counts right after the claim
    rolled_back  boolean NOT NULL DEFAULT false,  -- made in a transaction that then rolled back
    batch        boolean NOT NULL DEFAULT false,  -- an element of an rp_claim_batch call
    txid         bigint NOT NULL DEFAULT txid_current(),  -- the pgbench transaction that logged it
    txn_calls    integer NOT NULL DEFAULT 1,  -- rows that transaction logs (batch: 4, pair: 2)
    logged_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- What is left of an activity, read with a fresh snapshot after rp_claim ran
-- (a VOLATILE PL/pgSQL function takes one per statement; the status argument
-- makes the planner call it after the claim).  The claim's transaction-scoped
-- locks are still held and committed balances only go down during a round, so
-- this is at most what the claim saw: if it still covers the amount, the
-- claim's `exhausted` was false.
CREATE FUNCTION stress_seen(act bigint, status redpacket.claim_status,
                            OUT balance numeric, OUT packets numeric)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    SELECT sum(s.balance), sum(s.packets) INTO balance, packets
    FROM redpacket.stripe s WHERE s.activity_id = act;
END
$$;
