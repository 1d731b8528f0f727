import csv


class Inventory:
    def __init__(self):
        self.items = {}  # sku -> {"name": str, "qty": int, "unit_price": float}

    def add(self, sku, name, qty, unit_price):
        if not isinstance(qty, int) or qty <= 0:
            raise ValueError("qty must be a positive integer")
        item = self.items.setdefault(sku, {"name": name, "qty": 0, "unit_price": float(unit_price)})
        item["qty"] += qty

    def remove(self, sku, qty):
        item = self.items[sku]
        if qty <= 0:
            raise ValueError("qty must be positive")
        item["qty"] -= qty
        if item["qty"] == 0:
            del self.items[sku]

    def load_csv(self, path):
        with open(path, newline="") as f:
            for row in csv.reader(f):
                sku, name, qty, price = row
                self.add(sku, name, int(qty), float(price))

    def total_value(self):
        total = 0
        for item in self.items.values():
            total += item["qty"] * int(item["unit_price"])
        return round(total, 2)

    def low_stock(self, threshold):
        return sorted(sku for sku, item in self.items.items() if item["qty"] <= threshold)
