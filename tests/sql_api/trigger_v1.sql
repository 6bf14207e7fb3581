-- E5: a frozen v1 caller (an AFTER INSERT trigger); every later schema must keep it working.
CREATE TABLE orders (id serial PRIMARY KEY, item text NOT NULL);
CREATE FUNCTION orders_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM ship_job_runs_enqueue_v1('sql.plain', jsonb_build_object('order', NEW.id),
        dedupe_key => 'order-' || NEW.id);
    RETURN NEW;
END $$;
CREATE TRIGGER orders_enqueue AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION orders_enqueue();
