from inventory.inventory import Inventory

inv = Inventory()
inv.load_csv("/app/stock.csv")
inv.remove("B-200", 3)
with open("/app/report.txt", "w") as f:
    f.write(f"items: {len(inv.items)}\n")
    f.write(f"total_value: {inv.total_value():.2f}\n")
    f.write(f"low_stock: {','.join(inv.low_stock(5))}\n")
print(open("/app/report.txt").read(), end="")
