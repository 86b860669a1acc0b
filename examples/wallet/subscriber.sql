-- The wallet database of the example wallet service (README "Settling with
-- a wallet"): it subscribes to redpacket's publication redpacket_events and
-- keeps the users' wallets.  Run it in the wallet database, then
--
--     CREATE SUBSCRIPTION redpacket CONNECTION '...' PUBLICATION redpacket_events;
--
-- and run consumer.py.  The extension need not be installed here.

-- The four published tables, as plain tables with the publisher's columns
-- (logical replication matches them by name).
CREATE SCHEMA redpacket;
CREATE TABLE redpacket.claim (
    activity_id bigint, claim_id bigint, user_id text, request_id text,
    idempotency_key text, amount numeric, stripe integer, claimed_at timestamptz,
    PRIMARY KEY (activity_id, claim_id));
CREATE TABLE redpacket.ledger (
    activity_id bigint, entry_id bigint, kind text, amount numeric, reason text,
    created_at timestamptz, created_by name, packets integer, funder text,
    PRIMARY KEY (activity_id, entry_id));
CREATE TABLE redpacket.activity_change (
    activity_id bigint, change_id bigint, changed_at timestamptz, changed_by name,
    kind text, before jsonb, after jsonb, reason text,
    PRIMARY KEY (activity_id, change_id));
CREATE TABLE redpacket.claim_settlement (
    activity_id bigint, claim_id bigint, settlement_id bigint, state text,
    amount numeric, settled_at timestamptz, settled_by name, reference text, reason text,
    PRIMARY KEY (activity_id, claim_id));

-- The wallets, and one row per claim paid into one: its primary key is what
-- makes a payment happen once, however often a claim is delivered.
CREATE TABLE wallet (
    user_id text PRIMARY KEY,
    balance numeric NOT NULL);
CREATE TABLE wallet_credit (
    activity_id bigint,
    claim_id    bigint,
    user_id     text NOT NULL,
    amount      numeric NOT NULL,
    credited_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (activity_id, claim_id));

-- The consumer's work: claims that arrived (from the stream, or re-driven
-- from rp_pending_credits) and are not paid yet.  A row leaves it in the
-- transaction that pays the claim; reversed marks a claim the operator
-- undid before the wallet acknowledged it, which is never paid.
CREATE TABLE wallet_inbox (
    activity_id bigint,
    claim_id    bigint,
    user_id     text NOT NULL,
    amount      numeric NOT NULL,
    arrived_at  timestamptz NOT NULL DEFAULT now(),
    reversed    boolean NOT NULL DEFAULT false,
    PRIMARY KEY (activity_id, claim_id));

-- Replicated rows feed the inbox.  The subscription applies them with
-- session_replication_role = replica, so the triggers are ENABLE ALWAYS.
CREATE FUNCTION wallet_claim_arrived() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM public.wallet_credit c
                    WHERE c.activity_id = NEW.activity_id AND c.claim_id = NEW.claim_id) THEN
        INSERT INTO public.wallet_inbox (activity_id, claim_id, user_id, amount)
        VALUES (NEW.activity_id, NEW.claim_id, NEW.user_id, NEW.amount)
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER wallet_claim_arrived AFTER INSERT ON redpacket.claim
    FOR EACH ROW EXECUTE FUNCTION wallet_claim_arrived();
ALTER TABLE redpacket.claim ENABLE ALWAYS TRIGGER wallet_claim_arrived;

-- A reversal comes after its claim in commit order, so the claim is in the
-- inbox (or was never delivered, and rp_pending_credits does not list it).
CREATE FUNCTION wallet_settlement_arrived() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'reversed' THEN
        UPDATE public.wallet_inbox SET reversed = true
         WHERE activity_id = NEW.activity_id AND claim_id = NEW.claim_id;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER wallet_settlement_arrived AFTER INSERT ON redpacket.claim_settlement
    FOR EACH ROW EXECUTE FUNCTION wallet_settlement_arrived();
ALTER TABLE redpacket.claim_settlement ENABLE ALWAYS TRIGGER wallet_settlement_arrived;
