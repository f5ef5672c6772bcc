"""Set up the S3 server that checks credentials (moto started with INITIAL_NO_AUTH_ACTION_COUNT=4):
its first four requests, unauthenticated, create an IAM user, its access key, a policy allowing
it every S3 action, and the bucket; from then on moto checks every request's signature.

Usage: s3-auth-setup.py <endpoint> <bucket>; prints "<access key id> <secret access key>".
"""
import json
import sys

import boto3

endpoint, bucket = sys.argv[1], sys.argv[2]
bootstrap = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
iam = boto3.client("iam", **bootstrap)
iam.create_user(UserName="capstan-backups")
key = iam.create_access_key(UserName="capstan-backups")["AccessKey"]
policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
iam.put_user_policy(UserName="capstan-backups", PolicyName="s3", PolicyDocument=json.dumps(policy))
boto3.client("s3", **bootstrap).create_bucket(Bucket=bucket)
print(key["AccessKeyId"], key["SecretAccessKey"])
