#!/bin/bash
set -euo pipefail

# step: delete orphaned order_items rows
sqlite3 /app/shop.db "SELECT count(*) AS orphans FROM order_items WHERE order_id NOT IN (SELECT id FROM orders);"
sqlite3 /app/shop.db "DELETE FROM order_items WHERE order_id NOT IN (SELECT id FROM orders);"

# step: create the v_product_revenue view (paid orders only, every product listed)
sqlite3 /app/shop.db <<'SQL'
DROP VIEW IF EXISTS v_product_revenue;
CREATE VIEW v_product_revenue AS
SELECT p.sku AS sku, p.name AS name,
       COALESCE(SUM(pi.qty), 0) AS units,
       COALESCE(SUM(pi.qty * pi.unit_price_cents), 0) AS revenue_cents
FROM products p
LEFT JOIN (SELECT oi.* FROM order_items oi JOIN orders o ON o.id = oi.order_id WHERE o.status = 'paid') pi
       ON pi.product_id = p.id
GROUP BY p.id;
SQL
sqlite3 -header -column /app/shop.db "SELECT * FROM v_product_revenue ORDER BY revenue_cents DESC"

# step: export the top-5 report as CSV
sqlite3 -header -csv /app/shop.db "SELECT sku, name, units, printf('%.2f', revenue_cents / 100.0) AS revenue FROM v_product_revenue ORDER BY revenue_cents DESC, sku ASC LIMIT 5;" | tr -d '\r' > /app/report.csv
cat /app/report.csv

# step: write paid revenue per month as JSON
sqlite3 -json /app/shop.db "SELECT substr(o.created_at, 1, 7) AS month, ROUND(SUM(oi.qty * oi.unit_price_cents) / 100.0, 2) AS revenue FROM orders o JOIN order_items oi ON oi.order_id = o.id WHERE o.status = 'paid' GROUP BY month ORDER BY month;" | jq 'map({(.month): .revenue}) | add' > /app/monthly.json
cat /app/monthly.json
