-- Benchmark schema: the baselines redpacket is measured against, in their own
-- schema `bench`.
--
--   bench.claim    shaped like redpacket.claim (same columns, same keys, same
--                  uncached bigserial), so one INSERT into it is the ceiling:
--                  the least a durable "record one unique claim" can cost.
--   bench.balance  one row per activity: the single hot balance row of the
--                  seed-004 designs.
--   bench.claim_cond        seed 004, conditional UPDATE: unique insert, then
--                           UPDATE ... WHERE balance >= amount.
--   bench.claim_for_update  seed 004, SELECT ... FOR UPDATE on the balance
--                           row, then UPDATE and INSERT.
-- A run's activity id keeps runs apart in bench.claim and bench.balance.
CREATE EXTENSION IF NOT EXISTS redpacket;

CREATE SCHEMA bench;

CREATE TABLE bench.claim (
    activity_id     bigint NOT NULL,
    claim_id        bigserial,
    user_id         text COLLATE "C" NOT NULL,
    request_id      text COLLATE "C",
    idempotency_key text COLLATE "C" NOT NULL,
    amount          numeric NOT NULL,
    stripe          integer NOT NULL,
    claimed_at      timestamptz NOT NULL,
    PRIMARY KEY (activity_id, claim_id),
    UNIQUE (activity_id, user_id, idempotency_key)
);

CREATE TABLE bench.balance (
    id      bigint PRIMARY KEY,
    funded  numeric NOT NULL,
    balance numeric NOT NULL
);

CREATE SEQUENCE bench.run_id_seq START 1000000;

CREATE FUNCTION bench.claim_cond(p_act bigint, p_user text, p_amount numeric)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO bench.claim (activity_id, user_id, request_id, idempotency_key, amount, stripe, claimed_at)
    VALUES (p_act, p_user, NULL, '', p_amount, 0, now())
    RETURNING claim_id INTO v_id;
    UPDATE bench.balance SET balance = balance - p_amount
     WHERE id = p_act AND balance >= p_amount;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'activity % is exhausted', p_act;   -- undoes the insert
    END IF;
    RETURN v_id;
END;
$$;

CREATE FUNCTION bench.claim_for_update(p_act bigint, p_user text, p_amount numeric)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_balance numeric;
    v_id bigint;
BEGIN
    SELECT balance INTO v_balance FROM bench.balance WHERE id = p_act FOR UPDATE;
    IF v_balance < p_amount THEN
        RETURN NULL;
    END IF;
    UPDATE bench.balance SET balance = balance - p_amount WHERE id = p_act;
    INSERT INTO bench.claim (activity_id, user_id, request_id, idempotency_key, amount, stripe, claimed_at)
    VALUES (p_act, p_user, NULL, '', p_amount, 0, now())
    RETURNING claim_id INTO v_id;
    RETURN v_id;
END;
$$;

-- A new run: a bench.balance row with a budget that never runs out.
CREATE FUNCTION bench.new_run(p_funded numeric) RETURNS bigint LANGUAGE sql AS $$
    INSERT INTO bench.balance (id, funded, balance)
    VALUES (nextval('bench.run_id_seq'), p_funded, p_funded)
    RETURNING id;
$$;

-- Invariants of one run, as (check, ok, detail) rows.
--   kind 'ceiling'   no balance: one claim per user, and the claim count
--   kind 'balance'   seed 004: claims + remaining = funded, one claim per user
--   kind 'redpacket' rp_claim/rp_claim_batch: the ledger identity, one claim
--                    per user, stripe claim counters, and a full rp_reconcile
CREATE FUNCTION bench.check_run(p_kind text, p_act bigint, p_expect_claims bigint)
RETURNS TABLE (name text, ok boolean, detail text) LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
    nu bigint;
    s numeric;
    funded numeric;
    remaining numeric;
    stripe_claims bigint;
    rec record;
BEGIN
    IF p_kind = 'redpacket' THEN
        SELECT count(*), count(DISTINCT (user_id, idempotency_key)), coalesce(sum(amount), 0)
          INTO n, nu, s FROM redpacket.claim WHERE activity_id = p_act;
        SELECT coalesce(sum(amount) FILTER (WHERE kind = 'fund'), 0)
             - coalesce(sum(amount) FILTER (WHERE kind = 'return'), 0)
          INTO funded FROM redpacket.ledger WHERE activity_id = p_act;
        SELECT round(sum(st.balance)::numeric / (10::numeric ^ a.scale), a.scale), sum(st.claims)
          INTO remaining, stripe_claims
          FROM redpacket.stripe st JOIN redpacket.activity a ON a.id = st.activity_id
         WHERE st.activity_id = p_act GROUP BY a.scale;
    ELSE
        SELECT count(*), count(DISTINCT (user_id, idempotency_key)), coalesce(sum(amount), 0)
          INTO n, nu, s FROM bench.claim WHERE activity_id = p_act;
        SELECT b.funded, b.balance INTO funded, remaining FROM bench.balance b WHERE b.id = p_act;
    END IF;

    name := 'one claim per user';
    ok := n = nu;
    detail := format('%s claims, %s distinct users', n, nu);
    RETURN NEXT;

    IF p_expect_claims IS NOT NULL THEN
        name := 'every call claimed';
        ok := n = p_expect_claims;
        detail := format('%s claims recorded, %s expected from the client''s count', n, p_expect_claims);
        RETURN NEXT;
    END IF;

    IF p_kind <> 'ceiling' THEN
        name := 'claims + remaining = funded';
        ok := s + remaining = funded AND remaining >= 0;
        detail := format('%s + %s = %s, funded %s', s, remaining, s + remaining, funded);
        RETURN NEXT;
    END IF;

    IF p_kind = 'redpacket' THEN
        name := 'stripe claim counters';
        ok := stripe_claims = n;
        detail := format('stripes count %s claims, table holds %s', stripe_claims, n);
        RETURN NEXT;

        SELECT * INTO rec FROM redpacket.rp_reconcile(p_act, true);
        name := 'rp_reconcile full check';
        ok := coalesce(rec.ok, false);
        detail := format('expected %s, actual %s, claims %s/%s', rec.expected, rec.actual,
                         rec.expected_claims, rec.actual_claims);
        RETURN NEXT;
    END IF;
END;
$$;
