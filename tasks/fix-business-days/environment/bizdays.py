#!/usr/bin/env python3
import argparse
import datetime as dt
import sys


def parse_date(s):
    return dt.datetime.strptime(s, "%Y-%d-%m").date()


def load_holidays(path):
    days = set()
    if path:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    days.add(parse_date(line))
    return days


def business_days(start, end, holidays):
    count = 0
    day = start
    while day < end:
        if day.weekday() < 6 and day not in holidays:
            count += 1
        day += dt.timedelta(days=1)
    return count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("start")
    ap.add_argument("end")
    ap.add_argument("--holidays")
    a = ap.parse_args()
    start, end = parse_date(a.start), parse_date(a.end)
    if end < start:
        print("error: end before start", file=sys.stderr)
        return 1
    print(business_days(start, end, load_holidays(a.holidays)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
