import boto3

# TODO: move to env
KEY_ID = "AKIAZ7Q3M5N8P2R4T6V8"
s3 = boto3.client("s3", aws_access_key_id=KEY_ID)
print("password handling lives in auth.py")
