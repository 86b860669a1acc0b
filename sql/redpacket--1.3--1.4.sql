-- redpacket 1.3 -> 1.4.  Every change here is also in redpacket--1.4.sql, and
-- test/t/010_upgrade.pl proves that a database upgraded from 1.0, 1.1, 1.2 or
-- 1.3 equals a fresh 1.4.
\echo Use "ALTER EXTENSION redpacket UPDATE TO '1.4'" to load this file. \quit

-- The two statuses of 1.4, in the order rp_claim checks them.  (ALTER TYPE
-- ... ADD VALUE may run in the update's transaction as long as nothing here
-- uses the new values.)
ALTER TYPE redpacket.claim_status ADD VALUE 'not_eligible' BEFORE 'user_limit';
ALTER TYPE redpacket.claim_status ADD VALUE 'busy' BEFORE 'exhausted';
COMMENT ON TYPE redpacket.claim_status IS
    'Outcome of a claim, in the order rp_claim checks them: duplicate, frozen, not_started, ended, not_eligible, user_limit, busy, exhausted, claimed.';

-- rp_claim pins its search path in its definition again (SET search_path),
-- like every other SECURITY DEFINER function: a pin made in C only where the
-- C code foresaw that user-written code could run missed a case.  Both claim
-- functions are bound to symbols new in 1.4: a backend still running a
-- library older than 1.4 knows neither eligibility lists nor the other 1.4
-- rules, and refuses the call instead of running it.  CREATE OR REPLACE keeps
-- the OIDs, owners, privileges and comments.
CREATE OR REPLACE FUNCTION redpacket.rp_claim(
    activity   bigint,
    user_id    text,
    amount     numeric DEFAULT NULL,
    request_id text DEFAULT NULL)
RETURNS redpacket.claim_result
AS 'MODULE_PATHNAME', 'rp_claim_v14'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION redpacket.rp_claim_batch(
    activity    bigint,
    user_ids    text[],
    amounts     numeric[] DEFAULT NULL,
    request_ids text[] DEFAULT NULL)
RETURNS TABLE (ord integer, user_id text, status redpacket.claim_status,
               claim_id bigint, amount numeric, claimed_at timestamptz)
AS 'MODULE_PATHNAME', 'rp_claim_batch_v14'
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 100;

-- [engine] The claim engine ---------------------------------------------------
-- revision: bumped, under every stripe lock of the activity, by any change
-- of what a claim reads from the activity once and keeps (the schedule, the
-- packet cap); a claim pays from a stripe only at the revision it read.
-- dealt: amounts of a lucky draw drawn ahead for the whole activity (the
-- double-mean method over its undealt money and packets) and dealt to this
-- stripe; dealt_units and dealt_count are their sum and number, which
-- balance and packets include.  Fixed amounts are paid from the rest.
ALTER TABLE redpacket.activity ADD COLUMN revision bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN redpacket.activity.revision IS
    'Bumped by every change of the schedule or the packet cap; the stripes carry the same number.';
ALTER TABLE redpacket.stripe
    ADD COLUMN revision bigint NOT NULL DEFAULT 0,
    ADD COLUMN dealt bigint[],
    ADD COLUMN dealt_units bigint NOT NULL DEFAULT 0,
    ADD COLUMN dealt_count integer NOT NULL DEFAULT 0;
COMMENT ON COLUMN redpacket.stripe.revision IS
    'The activity''s revision this stripe was last brought to; a claim pays from it only at the revision it read.';
COMMENT ON COLUMN redpacket.stripe.dealt IS
    'Lucky-draw amounts (minor units) drawn ahead for the whole activity and dealt to this stripe, next first; NULL when none.';
COMMENT ON COLUMN redpacket.stripe.dealt_units IS 'Sum of dealt (included in balance).';
COMMENT ON COLUMN redpacket.stripe.dealt_count IS 'Number of dealt amounts (included in packets).';

-- Ledger entries of 1.4: top_up and withdraw (an operator changes a live
-- budget, any number of times), refund (a claim reversed after its activity
-- was settled goes back to the funder).  The funding and the return of the
-- remainder stay at most one each.
ALTER TABLE redpacket.ledger DROP CONSTRAINT ledger_kind_check;
ALTER TABLE redpacket.ledger ADD CONSTRAINT ledger_kind_check
    CHECK (kind IN ('fund', 'top_up', 'withdraw', 'return', 'refund'));
DROP INDEX redpacket.ledger_once;
CREATE UNIQUE INDEX ledger_once ON redpacket.ledger (activity_id, kind)
    WHERE kind IN ('fund', 'return');
COMMENT ON INDEX redpacket.ledger_once IS
    'An activity is funded once and its remainder returned at most once.';
COMMENT ON COLUMN redpacket.ledger.kind IS
    'fund (the budget, once at creation), top_up and withdraw (an operator changed the budget), return (the remainder, once at close or expiry), refund (a claim reversed after settlement, back to the funder).';

-- [campaign] Eligibility lists, live changes and their record -----------------

-- [wallet] Settling claims with the wallet -----------------------------------

-- [recon] The reconciler ------------------------------------------------------

-- [ops] Operating -------------------------------------------------------------

-- [citus] Scale-out -----------------------------------------------------------
