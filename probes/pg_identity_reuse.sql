-- Does a PostgreSQL identity column give a deleted newest row's id again? (temp table only)
CREATE TEMP TABLE m (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, t text);
INSERT INTO m (t) VALUES ('a'), ('b'), ('c');
DELETE FROM m WHERE id = 3;
INSERT INTO m (t) VALUES ('d');
SELECT id, t FROM m ORDER BY id;
