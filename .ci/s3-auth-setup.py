"""Set up an S3 server that checks credentials (moto started with INITIAL_NO_AUTH_ACTION_COUNT):
its first requests, unauthenticated, create an IAM user, its access key and its policy (and the
bucket); from then on moto checks every request's signature and the user's policy.

Usage:
  s3-auth-setup.py <endpoint> <bucket>   (INITIAL_NO_AUTH_ACTION_COUNT=4) a user allowed every
                                         S3 action, and the bucket
  s3-auth-setup.py --admin <endpoint>    (INITIAL_NO_AUTH_ACTION_COUNT=3) a user allowed every S3
                                         and IAM action: the object-storage bindings' admin
Prints "<access key id> <secret access key>".
"""
import json
import sys

import boto3

admin = sys.argv[1] == "--admin"
endpoint = sys.argv[2] if admin else sys.argv[1]
user, actions = ("capstan-admin", ["s3:*", "iam:*"]) if admin else ("capstan-backups", "s3:*")
bootstrap = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
iam = boto3.client("iam", **bootstrap)
iam.create_user(UserName=user)
key = iam.create_access_key(UserName=user)["AccessKey"]
policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps(policy))
if not admin:
    boto3.client("s3", **bootstrap).create_bucket(Bucket=sys.argv[2])
print(key["AccessKeyId"], key["SecretAccessKey"])
