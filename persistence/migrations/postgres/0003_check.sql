-- PostgreSQL 0003: a check that fails the transaction it runs in. A fast batch (persistence/
-- _pg_fast.py) sends BEGIN, its fence, its writes and COMMIT in one round trip; a lease that
-- did not hold, or a cut state that moved no row, must then stop the transaction on the
-- server, before its COMMIT: this raises SQLSTATE TK001 when `ok` is not true, and the batch
-- is rolled back whole and run again commit by commit.

CREATE FUNCTION turnkeeper_check(ok boolean, what text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION USING ERRCODE = 'TK001', MESSAGE = what;
    END IF;
    RETURN true;
END
$$;
